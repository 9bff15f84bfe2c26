//! The line parser: a hand-written tokenizer over `&str`.
//!
//! The line is split on ASCII whitespace and scanned once, left to right.
//! Each token is classified by its *shape*, never by its position, because
//! the set and order of fields varies between releases. Multi-token fields
//! (`RAM 1/2MB (lfb 1x2MB)`, `MTS fg 0% bg 0%`, `EDP limit 0`, bracketed
//! lists containing spaces) are recognised with bounded look-ahead; nothing
//! is consumed unless the whole field matches, so a malformed field degrades
//! to entries in [`Sample::unknown`] instead of swallowing its neighbours.
//!
//! No code path indexes or unwraps input-derived data, so no input can
//! panic; the work per line is linear in its length.

use std::collections::BTreeMap;

use crate::error::ParseError;
use crate::types::{Cpu, Emc, Engine, GpuFreq, Gr3d, Iram, Mts, Rail, Ram, Sample, Swap};

/// A bracketed value may contain spaces (`CPU [1%, , ]@Z` in NVIDIA's
/// documentation); at most this many tokens are joined looking for `]`,
/// which bounds the work per token.
const MAX_BRACKET_TOKENS: usize = 256;

/// Temperatures at or below this value are "sensor not available" sentinels.
const INVALID_TEMP_C: f64 = -256.0;

/// Longest `first_token` kept in [`ParseError::NotTegrastats`].
const ERROR_TOKEN_MAX: usize = 32;

/// Parses one line of tegrastats output.
///
/// Trailing `\n`/`\r\n` and any extra whitespace are ignored. Tokens that are
/// not understood are kept in [`Sample::unknown`]; they never make the line
/// fail.
///
/// # Errors
///
/// * [`ParseError::Empty`] if the line holds only whitespace.
/// * [`ParseError::NotTegrastats`] if, apart from an optional leading
///   timestamp, the line contains no recognised field other than generic
///   engine pairs (`NAME value`). Recognised fields are `RAM`, `SWAP`,
///   `IRAM`, a CPU list, `EMC`, `GR3D`, `MTS`, `EDP limit`, a temperature
///   (`name@tempC`) and a power rail (`NAME cur/avg`). Engine pairs alone are
///   not enough because ordinary text such as the `UTC 2020` of a `date`
///   line has that shape.
///
/// # Examples
///
/// A JetPack 6 AGX Orin line:
///
/// ```
/// use tegrastats_parser::{parse_line, GpuFreq};
///
/// let s = parse_line(
///     "05-09-2026 18:42:07 RAM 18202/62841MB (lfb 466x4MB) SWAP 86/31420MB (cached 0MB) \
///      CPU [16%@1949,6%@1761,4%@1222,4%@2201,4%@1036,33%@1036,0%@1036,40%@1036,3%@1190,\
///      46%@1190,6%@1190,2%@1190] EMC_FREQ 3%@2133 GR3D_FREQ 0%@[0,0] NVENC 78%@166 \
///      NVDEC off NVJPG off NVJPG1 off VIC 32%@115 OFA off NVDLA0 off NVDLA1 off \
///      PVA0_FREQ off APE 174 cpu@52.343C soc2@48.343C soc0@49.062C tj@52.343C \
///      soc1@49.531C VDD_GPU_SOC 2412mW/2412mW VDD_CPU_CV 1607mW/1607mW \
///      VIN_SYS_5V0 4607mW/4657mW",
/// )?;
/// assert_eq!(s.timestamp.as_deref(), Some("05-09-2026 18:42:07"));
/// assert_eq!(s.ram.unwrap().used_mb, 18202.0);
/// assert_eq!(s.cpus.len(), 12);
/// assert_eq!(s.cpus[0].unwrap().freq_mhz, Some(1949));
/// assert_eq!(s.gr3d.unwrap().freq_mhz, Some(GpuFreq::PerGpc(vec![0, 0])));
/// assert_eq!(s.engines["NVENC"].load_pct, Some(78));
/// assert!(s.engines["NVDEC"].off);
/// assert_eq!(s.temps_c["tj"], 52.343);
/// assert_eq!(s.power_mw["VIN_SYS_5V0"].average, 4657);
/// assert!(s.unknown.is_empty());
/// # Ok::<(), tegrastats_parser::ParseError>(())
/// ```
///
/// A legacy Jetson TK1 line, with one clock shared by all cores:
///
/// ```
/// let s = tegrastats_parser::parse_line(
///     "RAM 714/1876MB (lfb 139x4MB) SWAP 0/2048MB (cached 0MB) cpu [25%,7%,1%,1%]@2218 \
///      EMC 3%@924 AVP 0%@81 VDE 120 GR3D 0%@252 EDP limit 0",
/// )?;
/// assert!(s.cpus.iter().all(|c| c.unwrap().freq_mhz == Some(2218)));
/// assert_eq!(s.emc.unwrap().load_pct, Some(3));
/// assert_eq!(s.engines["VDE"].freq_mhz, Some(120));
/// assert_eq!(s.edp_limit_mhz, Some(0));
/// # Ok::<(), tegrastats_parser::ParseError>(())
/// ```
///
/// Lines that are not tegrastats output are rejected:
///
/// ```
/// use tegrastats_parser::{parse_line, ParseError};
///
/// assert_eq!(parse_line("  \r\n"), Err(ParseError::Empty));
/// assert!(matches!(
///     parse_line("Thu Dec 17 18:16:50 UTC 2020"),
///     Err(ParseError::NotTegrastats { .. })
/// ));
/// ```
pub fn parse_line(line: &str) -> Result<Sample, ParseError> {
    Parser::new(line).run()
}

impl std::str::FromStr for Sample {
    type Err = ParseError;

    /// Same as [`parse_line`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_line(s)
    }
}

/// Whether a temperature zone is a fixed placeholder rather than a sensor.
///
/// Jetson boards up to JetPack 5 print a `PMIC` zone whose value never
/// changes (`PMIC@100C` up to JetPack 4.5, `PMIC@50C` later): it is the
/// PMIC's thermal-alarm threshold, not a measurement. The parser keeps it in
/// [`Sample::temps_c`] exactly as printed; use this function (or
/// [`Sample::measured_temps`]) to leave it out of charts and alerts.
///
/// ```
/// assert!(tegrastats_parser::is_placeholder_temperature("PMIC"));
/// assert!(!tegrastats_parser::is_placeholder_temperature("CPU"));
/// ```
pub fn is_placeholder_temperature(name: &str) -> bool {
    name.eq_ignore_ascii_case("PMIC")
}

/// Look-ahead over the whitespace-separated tokens of a line.
///
/// The line is split once (`split_ascii_whitespace`) into a vector of
/// sub-slices, so look-ahead is an index operation rather than a re-scan.
struct Cursor<'a> {
    line: &'a str,
    tokens: Vec<&'a str>,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(line: &'a str) -> Self {
        // Real lines have 30 to 90 tokens.
        let mut tokens = Vec::with_capacity(96);
        tokens.extend(line.split_ascii_whitespace());
        Cursor {
            line,
            tokens,
            pos: 0,
        }
    }

    fn next(&mut self) -> Option<&'a str> {
        let token = self.peek(0)?;
        self.pos = self.pos.saturating_add(1);
        Some(token)
    }

    /// The `n`-th token after the current position (0 = next).
    fn peek(&self, n: usize) -> Option<&'a str> {
        self.tokens.get(self.pos.checked_add(n)?).copied()
    }

    fn skip(&mut self, n: usize) {
        self.pos = self.pos.saturating_add(n).min(self.tokens.len());
    }

    /// Byte offset of `token`, a sub-slice of the line.
    fn offset(&self, token: &str) -> usize {
        (token.as_ptr() as usize).wrapping_sub(self.line.as_ptr() as usize)
    }

    /// The original text from the start of `first` to the end of `last`,
    /// including the whitespace between them.
    fn span(&self, first: &'a str, last: &'a str) -> Option<&'a str> {
        let start = self.offset(first);
        let end = self.offset(last).checked_add(last.len())?;
        self.line.get(start..end)
    }

    /// The next value, joining tokens while a `[` is still open. Returns the
    /// text and the number of tokens it spans.
    fn value(&self) -> Option<(&'a str, usize)> {
        let first = self.peek(0)?;
        if !has_byte(first, b'[') || has_byte(first, b']') {
            return Some((first, 1));
        }
        for n in 1..MAX_BRACKET_TOKENS {
            let token = self.peek(n)?;
            if has_byte(token, b']') {
                return Some((self.span(first, token)?, n + 1));
            }
        }
        None
    }
}

/// What a field contributes to deciding whether the line is tegrastats.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    /// Not recognised: the token goes to `unknown`.
    None,
    /// A generic `NAME value` engine pair: recognised, but weak evidence.
    Weak,
    /// A field specific to tegrastats.
    Strong,
}

impl From<bool> for Field {
    fn from(ok: bool) -> Self {
        if ok {
            Field::Strong
        } else {
            Field::None
        }
    }
}

struct Parser<'a> {
    cur: Cursor<'a>,
    sample: Sample,
    seen_cpu: bool,
    /// Occurrence counters for names seen more than once, per map.
    dup_engines: BTreeMap<&'a str, u32>,
    dup_temps: BTreeMap<&'a str, u32>,
    dup_rails: BTreeMap<&'a str, u32>,
}

impl<'a> Parser<'a> {
    fn new(line: &'a str) -> Self {
        Parser {
            cur: Cursor::new(line),
            sample: Sample::default(),
            seen_cpu: false,
            dup_engines: BTreeMap::new(),
            dup_temps: BTreeMap::new(),
            dup_rails: BTreeMap::new(),
        }
    }

    fn run(mut self) -> Result<Sample, ParseError> {
        let Some(first) = self.cur.peek(0) else {
            return Err(ParseError::Empty);
        };
        self.timestamp();
        let mut strong = false;
        while let Some(token) = self.cur.next() {
            match self.field(token) {
                Field::Strong => strong = true,
                Field::Weak => {}
                Field::None => self.sample.unknown.push(token.to_owned()),
            }
        }
        if strong {
            Ok(self.sample)
        } else {
            Err(ParseError::NotTegrastats {
                first_token: truncate(first, ERROR_TOKEN_MAX).to_owned(),
            })
        }
    }

    /// `MM-DD-YYYY HH:MM:SS`, only at the very start of the line.
    fn timestamp(&mut self) {
        if let (Some(date), Some(time)) = (self.cur.peek(0), self.cur.peek(1)) {
            if matches_pattern(date, b"NN-NN-NNNN") && matches_pattern(time, b"NN:NN:NN") {
                if let Some(text) = self.cur.span(date, time) {
                    self.sample.timestamp = Some(text.to_owned());
                    self.cur.skip(2);
                }
            }
        }
    }

    /// Classifies `token` (already consumed) and consumes the field's
    /// remaining tokens if it matches.
    fn field(&mut self, token: &'a str) -> Field {
        match token {
            "RAM" => return self.ram().into(),
            "SWAP" => return self.swap().into(),
            "IRAM" => return self.iram().into(),
            "MTS" => return self.mts().into(),
            "EDP" => return self.edp().into(),
            "cpu" => return self.cpu().into(),
            // `CPU [..]` is the CPU list, `CPU 466/466` an AGX Xavier rail.
            "CPU" if self.cpu() => return Field::Strong,
            _ => {}
        }
        if has_byte(token, b'@') {
            return self.temperature(token).into();
        }
        if !is_name(token) {
            return Field::None;
        }
        if self.rail(token) {
            return Field::Strong;
        }
        match token {
            "EMC_FREQ" | "EMC" => self.emc().into(),
            "GR3D_FREQ" | "GR3D" => self.gr3d().into(),
            _ => {
                if self.engine(token) {
                    Field::Weak
                } else {
                    Field::None
                }
            }
        }
    }

    /// `RAM 1180/3965MB (lfb 1x2MB)`; the `(lfb ..)` group is optional.
    fn ram(&mut self) -> bool {
        if self.sample.ram.is_some() {
            return false;
        }
        let Some(((used_mb, total_mb), group)) = self.memory("lfb") else {
            return false;
        };
        let mut ram = Ram {
            used_mb,
            total_mb,
            ..Ram::default()
        };
        let mut consumed = 1;
        if let Some((text, n)) = group {
            if let Some((blocks, size)) = split_byte(text, b'x').and_then(|(b, s)| {
                let blocks = parse_u32(b)?;
                Some((blocks, parse_size(s)?))
            }) {
                ram.lfb_blocks = Some(blocks);
                ram.lfb_block_mb = Some(size);
                consumed += n;
            }
        }
        self.cur.skip(consumed);
        self.sample.ram = Some(ram);
        true
    }

    /// `SWAP 149/1024MB (cached 7MB)`; the `(cached ..)` group is optional.
    fn swap(&mut self) -> bool {
        if self.sample.swap.is_some() {
            return false;
        }
        let Some(((used_mb, total_mb), group)) = self.memory("cached") else {
            return false;
        };
        let mut swap = Swap {
            used_mb,
            total_mb,
            cached_mb: None,
        };
        let mut consumed = 1;
        if let Some((text, n)) = group {
            if let Some(size) = parse_size(text) {
                swap.cached_mb = Some(size);
                consumed += n;
            }
        }
        self.cur.skip(consumed);
        self.sample.swap = Some(swap);
        true
    }

    /// `IRAM 0/252kB(lfb 252kB)`, with or without a space before `(`.
    fn iram(&mut self) -> bool {
        if self.sample.iram.is_some() {
            return false;
        }
        let Some(((used_mb, total_mb), group)) = self.memory("lfb") else {
            return false;
        };
        let mut iram = Iram {
            used_mb,
            total_mb,
            lfb_mb: None,
        };
        let mut consumed = 1;
        if let Some((text, n)) = group {
            if let Some(size) = parse_size(text) {
                iram.lfb_mb = Some(size);
                consumed += n;
            }
        }
        self.cur.skip(consumed);
        self.sample.iram = Some(iram);
        true
    }

    /// Shared part of the memory fields: the `used/total` value token and an
    /// optional `(KEYWORD VALUE)` group after it. Consumes nothing.
    ///
    /// Returns the sizes and, if the group is present, its inner value text
    /// and the number of tokens it spans beyond the value token. The group
    /// may be glued to the value (`0/252kB(lfb`), in which case a malformed
    /// group makes the whole field fail.
    #[allow(clippy::type_complexity)]
    fn memory(&self, keyword: &str) -> Option<((f64, f64), Option<(&'a str, usize)>)> {
        let value = self.cur.peek(0)?;
        let group = match split_byte(value, b'(') {
            Some((pair, glued)) => {
                if glued != keyword {
                    return None;
                }
                let inner = self.cur.peek(1)?.strip_suffix(')')?;
                return Some((parse_size_pair(pair)?, Some((inner, 1))));
            }
            None => {
                let open = self.cur.peek(1).and_then(|t| t.strip_prefix('('));
                match (open, self.cur.peek(2)) {
                    (Some(k), Some(v)) if k == keyword => v.strip_suffix(')').map(|v| (v, 2)),
                    _ => None,
                }
            }
        };
        Some((parse_size_pair(value)?, group))
    }

    /// `CPU [a%@f,off,...]`, `cpu [a%,b%]@F`, `CPU [a%,b%, , ]@F`.
    fn cpu(&mut self) -> bool {
        if self.seen_cpu {
            return false;
        }
        let Some((text, n)) = self.cur.value() else {
            return false;
        };
        let Some(cpus) = parse_cpu_list(text) else {
            return false;
        };
        self.cur.skip(n);
        self.sample.cpus = cpus;
        self.seen_cpu = true;
        true
    }

    /// `MTS fg 0% bg 1%`.
    fn mts(&mut self) -> bool {
        if self.sample.mts.is_some() {
            return false;
        }
        let (Some("fg"), Some(fg), Some("bg"), Some(bg)) = (
            self.cur.peek(0),
            self.cur.peek(1),
            self.cur.peek(2),
            self.cur.peek(3),
        ) else {
            return false;
        };
        let (Some(fg_pct), Some(bg_pct)) = (parse_percent(fg), parse_percent(bg)) else {
            return false;
        };
        self.cur.skip(4);
        self.sample.mts = Some(Mts { fg_pct, bg_pct });
        true
    }

    /// `EDP limit 1734`.
    fn edp(&mut self) -> bool {
        if self.sample.edp_limit_mhz.is_some() {
            return false;
        }
        let (Some("limit"), Some(value)) = (self.cur.peek(0), self.cur.peek(1)) else {
            return false;
        };
        let Some(mhz) = parse_u32(value) else {
            return false;
        };
        self.cur.skip(2);
        self.sample.edp_limit_mhz = Some(mhz);
        true
    }

    /// `EMC_FREQ 3%@2133`, `EMC_FREQ 0%`, `EMC_FREQ @3199`, `EMC 0%@1600`.
    fn emc(&mut self) -> bool {
        if self.sample.emc.is_some() {
            return false;
        }
        let Some((load_pct, freq_mhz)) = self.cur.peek(0).and_then(|v| parse_load_freq(v, true))
        else {
            return false;
        };
        self.cur.skip(1);
        self.sample.emc = Some(Emc { load_pct, freq_mhz });
        true
    }

    /// `GR3D_FREQ 71%@1300`, `0%@[305,1300]`, `@[0,0,0]`, `0%`, `GR3D 0%@998`.
    fn gr3d(&mut self) -> bool {
        if self.sample.gr3d.is_some() {
            return false;
        }
        let Some((text, n)) = self.cur.value() else {
            return false;
        };
        let Some(gr3d) = parse_gr3d(text) else {
            return false;
        };
        self.cur.skip(n);
        self.sample.gr3d = Some(gr3d);
        true
    }

    /// Any other `NAME value` pair.
    fn engine(&mut self, name: &'a str) -> bool {
        let Some((text, n)) = self.cur.value() else {
            return false;
        };
        let Some(engine) = parse_engine(text) else {
            return false;
        };
        self.cur.skip(n);
        insert_unique(
            &mut self.sample.engines,
            &mut self.dup_engines,
            name,
            engine,
        );
        true
    }

    /// `VDD_IN 1931/1931`, `VDD_IN 5079mW/5079mW`, `VIN 1mW/2mW/3mW`.
    fn rail(&mut self, name: &'a str) -> bool {
        let Some(rail) = self.cur.peek(0).and_then(parse_rail) else {
            return false;
        };
        self.cur.skip(1);
        insert_unique(&mut self.sample.power_mw, &mut self.dup_rails, name, rail);
        true
    }

    /// `CPU@43.5C`, `cv0@-256C`, JetPack 7.2 `cpu@52.968C/52.968C`.
    fn temperature(&mut self, token: &'a str) -> bool {
        let Some((name, value)) = split_byte(token, b'@') else {
            return false;
        };
        if !is_zone_name(name) {
            return false;
        }
        let (current, peak) = match split_byte(value, b'/') {
            Some((current, peak)) => (current, Some(peak)),
            None => (value, None),
        };
        let Some(current) = parse_celsius(current) else {
            return false;
        };
        let peak = match peak.map(parse_celsius) {
            Some(None) => return false,
            Some(Some(p)) => Some(p),
            None => None,
        };
        let seen = self.sample.temps_c.contains_key(name)
            || self.sample.invalid_temps.iter().any(|n| n == name);
        let key = unique_key(seen, &mut self.dup_temps, name);
        if current <= INVALID_TEMP_C {
            self.sample.invalid_temps.push(key);
            return true;
        }
        if let Some(peak) = peak.filter(|p| *p > INVALID_TEMP_C) {
            self.sample.temps_peak_c.insert(key.clone(), peak);
        }
        self.sample.temps_c.insert(key, current);
        true
    }
}

/// `name` for the first occurrence, then `name#2`, `name#3`, ….
///
/// `seen` says whether `name` itself is already taken; `counts` holds the
/// last number handed out per name, so each duplicate costs one look-up.
fn unique_key<'a>(seen: bool, counts: &mut BTreeMap<&'a str, u32>, name: &'a str) -> String {
    if !seen && !counts.contains_key(name) {
        return name.to_owned();
    }
    let count = counts.entry(name).or_insert(1);
    *count = count.saturating_add(1);
    format!("{name}#{count}")
}

fn insert_unique<'a, V>(
    map: &mut BTreeMap<String, V>,
    counts: &mut BTreeMap<&'a str, u32>,
    name: &'a str,
    value: V,
) {
    let key = unique_key(map.contains_key(name), counts, name);
    map.insert(key, value);
}

/// Engine, clock and rail names: an upper-case ASCII letter followed by
/// upper-case letters, digits and `_` (`VDD_4V0_WIFI`, `NVDLA0_FREQ`).
fn is_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z'))
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Thermal-zone names: an ASCII letter followed by letters, digits, `_`
/// or `-` (`Tdiode`, `soc012`, `max170xx`, `iwlwifi`).
fn is_zone_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `pattern` uses `N` for an ASCII digit; every other byte must match.
fn matches_pattern(s: &str, pattern: &[u8]) -> bool {
    s.len() == pattern.len()
        && s.bytes().zip(pattern).all(|(b, &p)| match p {
            b'N' => b.is_ascii_digit(),
            _ => b == p,
        })
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// Whether `s` contains the ASCII byte `b`. A plain loop beats `memchr`
/// on the short tokens tegrastats prints.
fn has_byte(s: &str, b: u8) -> bool {
    s.bytes().any(|c| c == b)
}

/// Splits at the first ASCII byte `b`, which is always a char boundary.
fn split_byte(s: &str, b: u8) -> Option<(&str, &str)> {
    let i = s.bytes().position(|c| c == b)?;
    Some((s.get(..i)?, s.get(i + 1..)?))
}

/// `str::split` on an ASCII byte.
fn split_bytes(s: &str, sep: u8) -> SplitBytes<'_> {
    SplitBytes { rest: Some(s), sep }
}

struct SplitBytes<'a> {
    rest: Option<&'a str>,
    sep: u8,
}

impl<'a> Iterator for SplitBytes<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.rest?;
        match split_byte(rest, self.sep) {
            Some((item, tail)) => {
                self.rest = Some(tail);
                Some(item)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

/// A non-empty run of ASCII digits that fits in `u32`.
fn parse_u32(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `-?DIGITS(.DIGITS)?`; rejects the `inf`/`NaN`/exponent forms that
/// `f64::from_str` would accept.
fn parse_decimal(s: &str) -> Option<f64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match split_byte(digits, b'.') {
        Some((i, f)) => (i, Some(f)),
        None => (digits, None),
    };
    let all_digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || !frac.map_or(true, all_digits) {
        return None;
    }
    s.parse().ok()
}

/// `N%`.
fn parse_percent(s: &str) -> Option<u32> {
    parse_u32(s.strip_suffix('%')?)
}

/// `43.5C` → 43.5.
fn parse_celsius(s: &str) -> Option<f64> {
    parse_decimal(s.strip_suffix('C')?)
}

/// Splits a unit suffix off a size and returns the factor to MB.
fn split_unit(s: &str) -> (&str, Option<f64>) {
    const UNITS: [(&str, f64); 4] = [
        ("kB", 1.0 / 1024.0),
        ("KB", 1.0 / 1024.0),
        ("MB", 1.0),
        ("GB", 1024.0),
    ];
    for (suffix, factor) in UNITS {
        if let Some(number) = s.strip_suffix(suffix) {
            return (number, Some(factor));
        }
    }
    (s, None)
}

/// `7MB`, `512kB` → MB. The unit is required.
fn parse_size(s: &str) -> Option<f64> {
    let (number, factor) = split_unit(s);
    Some(parse_decimal(number)? * factor?)
}

/// `1180/3965MB` → (1180.0, 3965.0). The unit after the total is required
/// and applies to the used value unless that has its own (`1GB/4GB`).
fn parse_size_pair(s: &str) -> Option<(f64, f64)> {
    let (used, total) = split_byte(s, b'/')?;
    let (total, total_factor) = split_unit(total);
    let total_factor = total_factor?;
    let (used, used_factor) = split_unit(used);
    let used_factor = used_factor.unwrap_or(total_factor);
    Some((
        parse_decimal(used)? * used_factor,
        parse_decimal(total)? * total_factor,
    ))
}

/// `N%@F`, `N%`, `@F`, and (if `bare_is_freq`) a bare `F`, as
/// `(load, freq)`.
fn parse_load_freq(s: &str, bare_is_freq: bool) -> Option<(Option<u32>, Option<u32>)> {
    match split_byte(s, b'@') {
        Some((load, freq)) => {
            let load = if load.is_empty() {
                None
            } else {
                Some(parse_percent(load)?)
            };
            Some((load, Some(parse_u32(freq)?)))
        }
        None => match s.strip_suffix('%') {
            Some(load) => Some((Some(parse_u32(load)?), None)),
            None if bare_is_freq => Some((None, Some(parse_u32(s)?))),
            None => None,
        },
    }
}

/// `[a,b,c]` → the comma-separated items, trimmed of ASCII whitespace, and
/// the text after `]`. An empty `[]` has no items.
fn bracket_items(s: &str) -> Option<(impl Iterator<Item = &str>, &str)> {
    let (inside, after) = split_byte(s.strip_prefix('[')?, b']')?;
    let empty = inside
        .trim_matches(|c: char| c.is_ascii_whitespace())
        .is_empty();
    let items = split_bytes(inside, b',')
        .filter(move |_| !empty)
        .map(|item| item.trim_matches(|c: char| c.is_ascii_whitespace()));
    Some((items, after))
}

/// A list of plain numbers: `[305,1300]`.
fn parse_u32_list(s: &str) -> Option<Vec<u32>> {
    let (items, after) = bracket_items(s)?;
    if !after.is_empty() {
        return None;
    }
    items.map(parse_u32).collect()
}

/// The CPU list. Items are `N%@F`, `N%`, `@F`, `off` or empty (offline in
/// NVIDIA's documented legacy form); a shared `@F` after `]` applies to
/// every online core without its own clock.
fn parse_cpu_list(s: &str) -> Option<Vec<Option<Cpu>>> {
    let (items, after) = bracket_items(s)?;
    let shared = match after {
        "" => None,
        _ => Some(parse_u32(after.strip_prefix('@')?)?),
    };
    // Sized up front: Thor has 14 cores, and `collect` cannot know that.
    let mut cpus = Vec::with_capacity(s.bytes().filter(|&b| b == b',').count() + 1);
    for item in items {
        cpus.push(match item {
            "" | "off" => None,
            _ => {
                let (load_pct, freq_mhz) = parse_load_freq(item, false)?;
                Some(Cpu {
                    load_pct,
                    freq_mhz: freq_mhz.or(shared),
                })
            }
        });
    }
    Some(cpus)
}

fn parse_gr3d(s: &str) -> Option<Gr3d> {
    if let Some((load, freqs)) = split_byte(s, b'@') {
        if freqs.starts_with('[') {
            let load_pct = if load.is_empty() {
                None
            } else {
                Some(parse_percent(load)?)
            };
            return Some(Gr3d {
                load_pct,
                freq_mhz: Some(GpuFreq::PerGpc(parse_u32_list(freqs)?)),
            });
        }
    }
    let (load_pct, freq_mhz) = parse_load_freq(s, true)?;
    Some(Gr3d {
        load_pct,
        freq_mhz: freq_mhz.map(GpuFreq::Single),
    })
}

/// `off`, `N%@F`, `N%`, `@F`, `F`, or per-unit loads `[a%,b%]@F`.
fn parse_engine(s: &str) -> Option<Engine> {
    if s == "off" {
        return Some(Engine::off());
    }
    if s.starts_with('[') {
        let (items, after) = bracket_items(s)?;
        let unit_loads_pct = items.map(parse_percent).collect::<Option<Vec<_>>>()?;
        let freq_mhz = match after {
            "" => None,
            _ => Some(parse_u32(after.strip_prefix('@')?)?),
        };
        return Some(Engine {
            freq_mhz,
            unit_loads_pct,
            ..Engine::default()
        });
    }
    let (load_pct, freq_mhz) = parse_load_freq(s, true)?;
    Some(Engine::new(load_pct, freq_mhz))
}

/// `cur/avg` or `cur/avg/peak`, each optionally suffixed with `mW`.
fn parse_rail(s: &str) -> Option<Rail> {
    let mw = |p: &str| parse_u32(p.strip_suffix("mW").unwrap_or(p));
    let mut parts = split_bytes(s, b'/');
    let current = mw(parts.next()?)?;
    let average = mw(parts.next()?)?;
    let peak = match parts.next() {
        Some(p) => Some(mw(p)?),
        None => None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some(Rail {
        current,
        average,
        peak,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Sample {
        parse_line(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    #[test]
    fn numbers_are_strict() {
        assert_eq!(parse_u32("12"), Some(12));
        for bad in ["", "+1", "-1", "1.0", "4294967296", "1 "] {
            assert_eq!(parse_u32(bad), None, "{bad:?}");
        }
        assert_eq!(parse_decimal("-256"), Some(-256.0));
        assert_eq!(parse_decimal("49.093"), Some(49.093));
        for bad in ["", "-", "inf", "NaN", "1e5", "1.", ".5", "--1", "1.2.3"] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn byte_splitting_matches_str_split() {
        for s in ["", ",", "a,b", ",a,,b,", "é,ü"] {
            let ours: Vec<_> = split_bytes(s, b',').collect();
            let std: Vec<_> = s.split(',').collect();
            assert_eq!(ours, std, "{s:?}");
            assert_eq!(split_byte(s, b','), s.split_once(','));
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512kB"), Some(0.5));
        assert_eq!(parse_size("2GB"), Some(2048.0));
        assert_eq!(parse_size("7"), None);
        assert_eq!(parse_size_pair("1/2GB"), Some((1024.0, 2048.0)));
        assert_eq!(parse_size_pair("512kB/2MB"), Some((0.5, 2.0)));
        assert_eq!(parse_size_pair("1/2"), None);
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc", 2), "ab");
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("", 2), "");
    }

    #[test]
    fn cpu_forms() {
        let s = parse("CPU [1%@100,off,2%,@300, ]");
        assert_eq!(
            s.cpus,
            vec![
                Some(Cpu {
                    load_pct: Some(1),
                    freq_mhz: Some(100)
                }),
                None,
                Some(Cpu {
                    load_pct: Some(2),
                    freq_mhz: None
                }),
                Some(Cpu {
                    load_pct: None,
                    freq_mhz: Some(300)
                }),
                None,
            ]
        );
        // NVIDIA's documented legacy form, with spaces inside the brackets.
        let s = parse("RAM 1/2MB CPU [25%,7%, , ]@1734 EMC 0%@1600");
        assert_eq!(s.cpus.len(), 4);
        assert_eq!(s.online_cpu_count(), 2);
        assert_eq!(s.cpus[1].and_then(|c| c.freq_mhz), Some(1734));
        assert!(s.emc.is_some());
        assert!(s.unknown.is_empty(), "{:?}", s.unknown);
        assert!(parse("CPU []").cpus.is_empty());
    }

    #[test]
    fn unclosed_bracket_does_not_swallow_the_line() {
        let s = parse("RAM 1/2MB (lfb 1x2MB) CPU [1%@2,3%@4 EMC_FREQ 0%@204 cpu@40C");
        assert!(s.cpus.is_empty());
        assert_eq!(s.unknown, ["CPU", "[1%@2,3%@4"]);
        assert!(s.emc.is_some());
        assert_eq!(s.temps_c["cpu"], 40.0);
    }

    #[test]
    fn memory_groups() {
        let s = parse("RAM 1/2MB (lfb 1x2MB)");
        assert_eq!(s.ram.and_then(|r| r.lfb_blocks), Some(1));
        let s = parse("RAM 1/2MB(lfb 3x4MB) SWAP 0/1GB (cached 512kB)");
        assert_eq!(s.ram.and_then(|r| r.lfb_block_mb), Some(4.0));
        assert_eq!(s.swap.and_then(|s| s.cached_mb), Some(0.5));
        assert_eq!(s.swap.map(|s| s.total_mb), Some(1024.0));
        // No group: still a RAM field.
        let s = parse("RAM 1/2MB CPU [1%@2]");
        assert_eq!(s.ram.map(|r| r.lfb_blocks), Some(None));
        assert!(s.unknown.is_empty());
        // A malformed group is left to `unknown`.
        let s = parse("RAM 1/2MB (lfb bogus) CPU [1%@2]");
        assert!(s.ram.is_some());
        assert_eq!(s.unknown, ["(lfb", "bogus)"]);
        // A malformed glued group fails the whole field.
        let s = parse("IRAM 0/252kB(lfx 252kB) CPU [1%@2]");
        assert!(s.iram.is_none());
        assert_eq!(s.unknown, ["IRAM", "0/252kB(lfx", "252kB)"]);
        let s = parse("IRAM 0/252kB (lfb 252kB) CPU [1%@2]");
        assert_eq!(s.iram.and_then(|i| i.lfb_mb), Some(252.0 / 1024.0));
    }

    #[test]
    fn engine_forms() {
        let s = parse("RAM 1/2MB A 5 B 5% C 5%@6 D @6 E off F [1%,2%]@3 G [4%, 5%]");
        let e = |n: &str| s.engines[n].clone();
        assert_eq!(e("A"), Engine::new(None, Some(5)));
        assert_eq!(e("B"), Engine::new(Some(5), None));
        assert_eq!(e("C"), Engine::new(Some(5), Some(6)));
        assert_eq!(e("D"), Engine::new(None, Some(6)));
        assert_eq!(e("E"), Engine::off());
        assert_eq!(e("F").unit_loads_pct, [1, 2]);
        assert_eq!(e("F").freq_mhz, Some(3));
        assert_eq!(e("G").unit_loads_pct, [4, 5]);
        assert!(s.unknown.is_empty(), "{:?}", s.unknown);
    }

    #[test]
    fn gr3d_forms() {
        let g = |v: &str| parse_gr3d(v);
        assert_eq!(
            g("12%@[1300,1300]"),
            Some(Gr3d {
                load_pct: Some(12),
                freq_mhz: Some(GpuFreq::PerGpc(vec![1300, 1300]))
            })
        );
        assert_eq!(
            g("@[0,0,0]").and_then(|g| g.freq_mhz),
            Some(GpuFreq::PerGpc(vec![0; 3]))
        );
        assert_eq!(g("4%").and_then(|g| g.load_pct), Some(4));
        assert_eq!(
            g("0%@998").and_then(|g| g.freq_mhz),
            Some(GpuFreq::Single(998))
        );
        assert_eq!(g("0%@[1,]"), None);
        assert_eq!(g("0%@[1]x"), None);
        assert_eq!(g("off"), None);
    }

    #[test]
    fn duplicates_get_numbered_keys() {
        let s = parse("RAM 1/2MB NC 0mW/0mW X 1mW/1mW NC 2mW/2mW NC 3/3 a@1C a@2C E 1 E 2");
        let keys: Vec<_> = s.power_mw.keys().map(String::as_str).collect();
        assert_eq!(keys, ["NC", "NC#2", "NC#3", "X"]);
        assert_eq!(s.power_mw["NC#2"].current, 2);
        assert_eq!(s.temps_c["a#2"], 2.0);
        assert_eq!(s.engines["E#2"].freq_mhz, Some(2));
        // A second RAM field is not merged: it is reported as unknown.
        let s = parse("RAM 1/2MB RAM 3/4MB");
        assert_eq!(s.ram.map(|r| r.used_mb), Some(1.0));
        assert_eq!(s.unknown, ["RAM", "3/4MB"]);
    }

    #[test]
    fn temperatures() {
        let s = parse("a@-256C b@-300.5C c@-40C d@1C/-256C e@1.5C/2.25C a@-256C a@3C");
        assert_eq!(s.invalid_temps, ["a", "b", "a#2"]);
        assert_eq!(s.temps_c["a#3"], 3.0);
        assert_eq!(s.temps_c["c"], -40.0);
        assert_eq!(s.temps_c["d"], 1.0);
        assert!(!s.temps_peak_c.contains_key("d"));
        assert_eq!(s.temps_peak_c["e"], 2.25);
        let s = parse("RAM 1/2MB x@1 x@C @1C 1x@2C x@1C/ x@1C/2C/3C");
        assert!(s.temps_c.is_empty());
        assert_eq!(s.unknown.len(), 6);
    }

    #[test]
    fn rails() {
        assert_eq!(
            parse_rail("1/2/3mW"),
            Some(Rail {
                current: 1,
                average: 2,
                peak: Some(3)
            })
        );
        for bad in ["1", "1/", "/1", "1/2/3/4", "1W/2W", "a/b"] {
            assert_eq!(parse_rail(bad), None, "{bad:?}");
        }
        // The AGX Xavier `CPU` rail is not the CPU list.
        let s = parse("RAM 1/2MB CPU [1%@2] CPU 466/466");
        assert_eq!(s.power_mw["CPU"].current, 466);
        assert_eq!(s.cpus.len(), 1);
    }

    #[test]
    fn timestamp_only_at_start() {
        let s = parse("01-02-2024  03:04:05 RAM 1/2MB");
        assert_eq!(s.timestamp.as_deref(), Some("01-02-2024  03:04:05"));
        let s = parse("RAM 1/2MB 01-02-2024 03:04:05");
        assert_eq!(s.timestamp, None);
        assert_eq!(s.unknown, ["01-02-2024", "03:04:05"]);
    }

    #[test]
    fn rejection_rule() {
        assert_eq!(parse_line(""), Err(ParseError::Empty));
        assert_eq!(parse_line(" \t\r\n"), Err(ParseError::Empty));
        for line in [
            "01-02-2024 03:04:05",
            "UTC 2020",
            "pon, 6 maj 2024, 18:29:45 UTC",
            "APE 150 NVENC off",
        ] {
            assert!(
                matches!(parse_line(line), Err(ParseError::NotTegrastats { .. })),
                "{line:?}"
            );
        }
        let long = "é".repeat(40);
        match parse_line(&long) {
            Err(ParseError::NotTegrastats { first_token }) => assert_eq!(first_token.len(), 32),
            other => panic!("{other:?}"),
        }
        // Any one strong field is enough.
        assert!(parse_line("cpu@40C").is_ok());
        assert!(parse_line("VDD_IN 1/1").is_ok());
        assert!(parse_line("GR3D_FREQ 0%").is_ok());
    }

    #[test]
    fn engine_lookup_by_base_name() {
        let s = parse("RAM 1/2MB VIC_FREQ 115 NVENC_LOAD 7% OFA off");
        assert_eq!(s.engine("VIC").and_then(|e| e.freq_mhz), Some(115));
        assert_eq!(s.engine("NVENC").and_then(|e| e.load_pct), Some(7));
        assert!(s.engine("OFA").is_some_and(|e| e.off));
        assert!(s.engine("NVDEC").is_none());
    }

    #[test]
    fn placeholder_pmic() {
        let s = parse("CPU@30C PMIC@100C");
        assert_eq!(s.temps_c["PMIC"], 100.0);
        let measured: Vec<_> = s.measured_temps().collect();
        assert_eq!(measured, [("CPU", 30.0)]);
    }
}
