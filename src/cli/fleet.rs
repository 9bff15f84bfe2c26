//! `edgewatch fleet keygen|sign|publish`: the fleet side of signed remote config. `keygen`
//! writes a key pair, `sign` prints a signed document for a TOML fragment, `publish` puts a
//! signed document on a broker as the retained message of a layer's topic. None of them
//! talks to an agent or reads a config file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};

use edgewatch::config::Secret;
use edgewatch::fleet::{config::FleetConfig, doc, mqtt};

#[derive(clap::Subcommand)]
pub enum FleetCommand {
    /// Write a new key pair: DIR/fleet.key (private, mode 0600) and DIR/fleet.pub (the
    /// line [fleet] public_key takes).
    Keygen {
        /// Directory to write the two files to (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Replace existing key files.
        #[arg(long)]
        force: bool,
    },
    /// Print FRAGMENT (a TOML fragment of the config) as a signed document of version N.
    #[command(disable_version_flag = true)]
    Sign {
        /// The private key (fleet.key).
        #[arg(long, value_name = "KEY")]
        key: PathBuf,
        /// The layer's version: higher than the one the devices run.
        #[arg(long, value_name = "N")]
        version: u64,
        /// The TOML fragment.
        fragment: PathBuf,
    },
    /// Publish SIGNED (a document from `sign`) retained, at QoS 1, to a layer's topic.
    Publish(PublishArgs),
}

#[derive(clap::Args)]
pub struct PublishArgs {
    /// The broker: mqtt://host:port or mqtts://host:port.
    #[arg(long, value_name = "URL")]
    mqtt: String,
    /// Which layer: all, group:NAME or device:ID.
    #[arg(long, value_name = "TARGET")]
    target: String,
    /// Broker user name.
    #[arg(long)]
    username: Option<String>,
    /// Broker password (or EDGEWATCH_FLEET_PASSWORD).
    #[arg(long, env = "EDGEWATCH_FLEET_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// CA certificate (PEM) for mqtts:// (default: the system's).
    #[arg(long, value_name = "FILE")]
    ca_file: Option<String>,
    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, value_name = "FILE")]
    cert_file: Option<String>,
    /// Client key (PEM) for mutual TLS.
    #[arg(long, value_name = "FILE")]
    key_file: Option<String>,
    /// Seconds to wait for the broker's acknowledgement.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// The signed document.
    signed: PathBuf,
}

pub fn run(cmd: FleetCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        FleetCommand::Keygen { out, force } => keygen(out, force),
        FleetCommand::Sign {
            key,
            version,
            fragment,
        } => sign(key, version, fragment),
        FleetCommand::Publish(args) => publish(args),
    }
}

fn keygen(out: PathBuf, force: bool) -> anyhow::Result<ExitCode> {
    let key = out.join("fleet.key");
    let public = out.join("fleet.pub");
    if !force && (key.exists() || public.exists()) {
        bail!(
            "{} or {} exists: keep the fleet's key, or pass --force to replace it (devices \
             then refuse documents until their [fleet] public_key is changed)",
            key.display(),
            public.display()
        );
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let (private, public_text) = doc::generate()?;
    edgewatch::fsutil::write_atomic(&key, format!("{private}\n").as_bytes(), 0o600)
        .with_context(|| format!("writing {}", key.display()))?;
    // write_atomic's mode applies to a new file only: make sure a replaced one is 0600 too.
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", key.display()))?;
    edgewatch::fsutil::write_atomic(&public, format!("{public_text}\n").as_bytes(), 0o644)
        .with_context(|| format!("writing {}", public.display()))?;
    eprintln!(
        "wrote {} (private: keep it off the devices) and {}",
        key.display(),
        public.display()
    );
    println!("public_key = \"{public_text}\"");
    Ok(ExitCode::SUCCESS)
}

fn sign(key: PathBuf, version: u64, fragment: PathBuf) -> anyhow::Result<ExitCode> {
    let key_text =
        std::fs::read_to_string(&key).with_context(|| format!("reading {}", key.display()))?;
    let pair = doc::private_key(&key_text).with_context(|| key.display().to_string())?;
    let body = std::fs::read_to_string(&fragment)
        .with_context(|| format!("reading {}", fragment.display()))?;
    // Catch a broken fragment here rather than on every device.
    toml::from_str::<toml::Table>(&body)
        .map_err(|e| anyhow::anyhow!("{}: not valid TOML: {e}", fragment.display()))?;
    print!("{}", doc::sign(&pair, version, &body));
    Ok(ExitCode::SUCCESS)
}

fn publish(a: PublishArgs) -> anyhow::Result<ExitCode> {
    let topic = mqtt::target_topic(&a.target).map_err(anyhow::Error::msg)?;
    let payload =
        std::fs::read(&a.signed).with_context(|| format!("reading {}", a.signed.display()))?;
    let d = doc::parse(&payload, usize::MAX)
        .with_context(|| format!("{}: run `edgewatch fleet sign` first", a.signed.display()))?;
    let cfg = FleetConfig {
        username: a.username,
        password: a.password.map(Secret::new),
        ca_file: a.ca_file,
        cert_file: a.cert_file,
        key_file: a.key_file,
        ..FleetConfig::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let client_id = format!("edgewatch-fleet-publish-{}", std::process::id());
    rt.block_on(mqtt::publish(
        &cfg,
        &a.mqtt,
        client_id,
        &topic,
        payload,
        Duration::from_secs(a.timeout.max(1)),
    ))
    .map_err(anyhow::Error::msg)?;
    println!("published version {} to {topic} (retained)", d.version);
    Ok(ExitCode::SUCCESS)
}
