/*
 * A stand-in for the NVIDIA driver's user library, libnvidia-ml.so.1, for the integration
 * tests: it exports the NVML entry points edgewatch calls (through nvml-wrapper), with the
 * argument lists and struct layouts of NVIDIA's public nvml.h, and answers them from a
 * scenario file instead of a GPU. It never touches a device, never writes a file and never
 * blocks. Written for edgewatch from the documented ABI; no NVIDIA code.
 *
 * Build: cc -shared -fPIC -o libnvidia-ml.so.1 stub.c
 *   -DOLD_DRIVER  leaves out the entry points an older driver lacks (the _v2/_v3 versions
 *                 of memory info, CUDA version, fan speed and running processes, and
 *                 nvmlDeviceGetNumFans, nvmlDeviceGetArchitecture, the MIG calls), keeping
 *                 their older forms where NVML had one.
 *
 * The scenario file is named by $NVML_STUB_SCENARIO, read at nvmlInit and again whenever
 * it is replaced (checked when a sample starts and when a GPU's UUID is asked). One entry a
 * line, '#' starts a comment:
 *
 *   driver 550.54.15              nvmlSystemGetDriverVersion
 *   cuda 12040                    nvmlSystemGetCudaDriverVersion (1000*major + 10*minor)
 *   procname 4242 python3         nvmlSystemGetProcessName
 *   gpus 2                        device count
 *   gpu I name TEXT...            also: uuid TEXT
 *   gpu I KEY V1 V2 ...           a value (numbers, or NA for NVML_VALUE_NOT_AVAILABLE)
 *   gpu I KEY NOT_SUPPORTED       the call answers NVML_ERROR_NOT_SUPPORTED
 *   gpu I KEY V... GPU_IS_LOST N  the value, then NVML_ERROR_GPU_IS_LOST from sample N on
 *   gpu I lost N                  every call on GPU I fails GPU_IS_LOST from sample N on
 *   gpu I mig SLOT UUID TOTAL USED FREE   one MIG instance
 *
 * KEY is one of: arch, cc, utilization, memory, bar1, temperature, temp_slowdown,
 * temp_shutdown, temp_max_operating, power, power_limit, energy, clock_graphics,
 * clock_sm, clock_mem, clock_video, clock_graphics_max, clock_sm_max, clock_mem_max,
 * clock_video_max, throttle_reasons, pcie_tx, pcie_rx, pcie_link_gen, pcie_link_width,
 * fan (one value per fan), ecc (enabled corrected uncorrected), mig_mode (current
 * pending), processes (pid bytes pairs, compute), graphics_processes (pid bytes pairs),
 * process_utilization (pid sm% mem% triples). A key not given answers NOT_SUPPORTED.
 * A sample is a call of nvmlDeviceGetUtilizationRates on that GPU (the agent's first read
 * of each sample); samples are counted from 1 and survive a reload.
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef int nvmlReturn_t;
enum {
    OK = 0,
    E_UNINITIALIZED = 1,
    E_INVALID_ARGUMENT = 2,
    E_NOT_SUPPORTED = 3,
    E_NOT_FOUND = 6,
    E_INSUFFICIENT_SIZE = 7,
    E_DRIVER_NOT_LOADED = 9,
    E_GPU_IS_LOST = 15,
    E_ARGUMENT_VERSION_MISMATCH = 25,
};

#define MAX_GPUS 8
#define MAX_MIGS 7
#define MAX_KEYS 48
#define MAX_VALS 24
#define NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL

struct entry {
    char key[32];
    int unsupported;
    int nvals;
    unsigned long long vals[MAX_VALS];
    unsigned long long lost_from; /* 0: never */
};

struct mig {
    int present;
    char uuid[96];
    unsigned long long total, used, free;
};

struct gpu {
    char name[96];
    char uuid[96];
    int nkeys;
    struct entry keys[MAX_KEYS];
    unsigned long long lost_from;
    struct mig migs[MAX_MIGS];
};

struct procname {
    unsigned pid;
    char name[64];
};

static struct {
    int initialised;
    char driver[80];
    int cuda;
    unsigned count;
    struct gpu gpus[MAX_GPUS];
    struct procname names[16];
    int nnames;
} sc;

/* Kept across reloads. */
static unsigned long long samples[MAX_GPUS];
static unsigned long long util_clock[MAX_GPUS];
static struct stat loaded;

/* Handles are addresses inside these arrays; nothing else is ever handed out. */
static char gpu_handles[MAX_GPUS];
static char mig_handles[MAX_GPUS][MAX_MIGS];

static void trim(char *s) {
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
        s[--n] = '\0';
}

static void parse_entry(struct gpu *g, const char *key, char *rest) {
    if (g->nkeys >= MAX_KEYS)
        return;
    struct entry *e = &g->keys[g->nkeys++];
    memset(e, 0, sizeof *e);
    snprintf(e->key, sizeof e->key, "%s", key);
    for (char *tok = strtok(rest, " \t"); tok; tok = strtok(NULL, " \t")) {
        if (strcmp(tok, "NOT_SUPPORTED") == 0) {
            e->unsupported = 1;
        } else if (strcmp(tok, "GPU_IS_LOST") == 0) {
            char *n = strtok(NULL, " \t");
            e->lost_from = n ? strtoull(n, NULL, 10) : 1;
        } else if (e->nvals < MAX_VALS) {
            e->vals[e->nvals++] = strcmp(tok, "NA") == 0 ? NOT_AVAILABLE : strtoull(tok, NULL, 10);
        }
    }
}

static int load(void) {
    const char *path = getenv("NVML_STUB_SCENARIO");
    if (!path)
        return -1;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    struct stat st;
    if (fstat(fileno(f), &st) == 0)
        loaded = st;
    memset(&sc.gpus, 0, sizeof sc.gpus);
    sc.driver[0] = '\0';
    sc.cuda = -1;
    sc.count = 0;
    sc.nnames = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        trim(line);
        char word[32];
        int off = 0;
        if (sscanf(line, "%31s %n", word, &off) != 1)
            continue;
        char *rest = line + off;
        if (strcmp(word, "driver") == 0) {
            snprintf(sc.driver, sizeof sc.driver, "%s", rest);
        } else if (strcmp(word, "cuda") == 0) {
            sc.cuda = atoi(rest);
        } else if (strcmp(word, "gpus") == 0) {
            sc.count = (unsigned)atoi(rest);
            if (sc.count > MAX_GPUS)
                sc.count = MAX_GPUS;
        } else if (strcmp(word, "procname") == 0 && sc.nnames < 16) {
            struct procname *p = &sc.names[sc.nnames];
            if (sscanf(rest, "%u %63s", &p->pid, p->name) == 2)
                sc.nnames++;
        } else if (strcmp(word, "gpu") == 0) {
            unsigned idx;
            char key[32];
            int off2 = 0;
            if (sscanf(rest, "%u %31s %n", &idx, key, &off2) < 2 || idx >= MAX_GPUS)
                continue;
            struct gpu *g = &sc.gpus[idx];
            char *val = rest + off2;
            if (strcmp(key, "name") == 0) {
                snprintf(g->name, sizeof g->name, "%s", val);
            } else if (strcmp(key, "uuid") == 0) {
                snprintf(g->uuid, sizeof g->uuid, "%s", val);
            } else if (strcmp(key, "lost") == 0) {
                g->lost_from = strtoull(val, NULL, 10);
            } else if (strcmp(key, "mig") == 0) {
                unsigned slot;
                struct mig m = {1, "", 0, 0, 0};
                if (sscanf(val, "%u %95s %llu %llu %llu", &slot, m.uuid, &m.total, &m.used,
                           &m.free) == 5 &&
                    slot < MAX_MIGS)
                    g->migs[slot] = m;
            } else {
                parse_entry(g, key, val);
            }
        }
    }
    fclose(f);
    return 0;
}

/* Reloads the scenario when the file was replaced or rewritten. */
static void refresh(void) {
    const char *path = getenv("NVML_STUB_SCENARIO");
    struct stat st;
    if (!path || stat(path, &st) != 0)
        return;
    if (st.st_ino != loaded.st_ino || st.st_size != loaded.st_size ||
        st.st_mtim.tv_sec != loaded.st_mtim.tv_sec ||
        st.st_mtim.tv_nsec != loaded.st_mtim.tv_nsec)
        load();
}

/* Resolves a handle: the GPU index, and the MIG slot or -1. */
static int resolve(const void *h, int *mig) {
    const char *p = h;
    if (p >= gpu_handles && p < gpu_handles + MAX_GPUS) {
        *mig = -1;
        return (int)(p - gpu_handles);
    }
    if (p >= &mig_handles[0][0] && p < &mig_handles[0][0] + MAX_GPUS * MAX_MIGS) {
        long off = p - &mig_handles[0][0];
        *mig = (int)(off % MAX_MIGS);
        return (int)(off / MAX_MIGS);
    }
    return -1;
}

/* The GPU behind a handle, or an error: uninitialised, bad handle, or lost. */
static nvmlReturn_t device(const void *h, struct gpu **out, int *mig) {
    if (!sc.initialised)
        return E_UNINITIALIZED;
    int m;
    int i = resolve(h, &m);
    if (i < 0 || (unsigned)i >= sc.count)
        return E_INVALID_ARGUMENT;
    struct gpu *g = &sc.gpus[i];
    if (g->lost_from && samples[i] >= g->lost_from)
        return E_GPU_IS_LOST;
    *out = g;
    if (mig)
        *mig = m;
    return OK;
}

/* The entry `key` of the GPU behind `h` with at least `need` values, or why not. */
static nvmlReturn_t lookup(const void *h, const char *key, int need, struct entry **out) {
    struct gpu *g;
    int m;
    nvmlReturn_t r = device(h, &g, &m);
    if (r != OK)
        return r;
    if (m >= 0)
        return E_NOT_SUPPORTED;
    int i = (int)(g - sc.gpus);
    for (int k = 0; k < g->nkeys; k++) {
        struct entry *e = &g->keys[k];
        if (strcmp(e->key, key) != 0)
            continue;
        if (e->lost_from && samples[i] >= e->lost_from)
            return E_GPU_IS_LOST;
        if (e->unsupported || e->nvals < need)
            return E_NOT_SUPPORTED;
        *out = e;
        return OK;
    }
    return E_NOT_SUPPORTED;
}

static nvmlReturn_t one_uint(const void *h, const char *key, unsigned *out) {
    struct entry *e;
    nvmlReturn_t r;
    if (!out)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(h, key, 1, &e)) != OK)
        return r;
    *out = (unsigned)e->vals[0];
    return OK;
}

static nvmlReturn_t copy_text(const char *s, char *out, unsigned len) {
    if (!out)
        return E_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len)
        return E_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return OK;
}

/* ---- init, system ---- */

nvmlReturn_t nvmlInit_v2(void) {
    if (load() != 0)
        return E_DRIVER_NOT_LOADED;
    sc.initialised = 1;
    return OK;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
    if (!sc.initialised)
        return E_UNINITIALIZED;
    sc.initialised = 0;
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK:
        return "Success";
    case E_NOT_SUPPORTED:
        return "Not Supported";
    case E_GPU_IS_LOST:
        return "GPU is lost";
    default:
        return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    if (!sc.initialised)
        return E_UNINITIALIZED;
    return copy_text(sc.driver, version, length);
}

static nvmlReturn_t cuda_version(int *v) {
    if (!sc.initialised)
        return E_UNINITIALIZED;
    if (!v)
        return E_INVALID_ARGUMENT;
    if (sc.cuda < 0)
        return E_NOT_SUPPORTED;
    *v = sc.cuda;
    return OK;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version(v); }
#ifndef OLD_DRIVER
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version(v); }
#endif

nvmlReturn_t nvmlSystemGetProcessName(unsigned pid, char *name, unsigned length) {
    if (!sc.initialised)
        return E_UNINITIALIZED;
    for (int i = 0; i < sc.nnames; i++)
        if (sc.names[i].pid == pid)
            return copy_text(sc.names[i].name, name, length);
    return E_NOT_FOUND;
}

/* ---- devices ---- */

static nvmlReturn_t count(unsigned *n) {
    if (!sc.initialised)
        return E_UNINITIALIZED;
    if (!n)
        return E_INVALID_ARGUMENT;
    *n = sc.count;
    return OK;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { return count(n); }
nvmlReturn_t nvmlDeviceGetCount(unsigned *n) { return count(n); }

static nvmlReturn_t handle_by_index(unsigned index, void **dev) {
    if (!sc.initialised)
        return E_UNINITIALIZED;
    if (index >= sc.count || !dev)
        return E_INVALID_ARGUMENT;
    *dev = &gpu_handles[index];
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void **dev) {
    return handle_by_index(index, dev);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, void **dev) {
    return handle_by_index(index, dev);
}

nvmlReturn_t nvmlDeviceGetName(void *dev, char *name, unsigned length) {
    struct gpu *g;
    int m;
    nvmlReturn_t r = device(dev, &g, &m);
    if (r != OK)
        return r;
    return copy_text(g->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(void *dev, char *uuid, unsigned length) {
    refresh();
    struct gpu *g;
    int m;
    nvmlReturn_t r = device(dev, &g, &m);
    if (r != OK)
        return r;
    return copy_text(m >= 0 ? g->migs[m].uuid : g->uuid, uuid, length);
}

#ifndef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetArchitecture(void *dev, unsigned *arch) {
    return one_uint(dev, "arch", arch);
}
#endif

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *dev, int *major, int *minor) {
    struct entry *e;
    nvmlReturn_t r;
    if (!major || !minor)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "cc", 2, &e)) != OK)
        return r;
    *major = (int)e->vals[0];
    *minor = (int)e->vals[1];
    return OK;
}

/* ---- readings ---- */

struct utilization {
    unsigned gpu, memory;
};

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *dev, struct utilization *u) {
    int m;
    int i = resolve(dev, &m);
    if (sc.initialised && i >= 0 && m < 0) {
        refresh();
        samples[i]++;
    }
    struct entry *e;
    nvmlReturn_t r;
    if (!u)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "utilization", 2, &e)) != OK)
        return r;
    u->gpu = (unsigned)e->vals[0];
    u->memory = (unsigned)e->vals[1];
    return OK;
}

struct memory_v1 {
    unsigned long long total, free, used;
};

struct memory_v2 {
    unsigned version;
    unsigned long long total, reserved, free, used;
};

/* total, used, free of a GPU's `key` entry or of a MIG instance. */
static nvmlReturn_t memory(void *dev, const char *key, unsigned long long out[3]) {
    struct gpu *g;
    int m;
    nvmlReturn_t r = device(dev, &g, &m);
    if (r != OK)
        return r;
    if (m >= 0) {
        if (!g->migs[m].present || strcmp(key, "memory") != 0)
            return E_NOT_SUPPORTED;
        out[0] = g->migs[m].total;
        out[1] = g->migs[m].used;
        out[2] = g->migs[m].free;
        return OK;
    }
    struct entry *e;
    if ((r = lookup(dev, key, 3, &e)) != OK)
        return r;
    memcpy(out, e->vals, 3 * sizeof out[0]);
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *dev, struct memory_v1 *mem) {
    unsigned long long v[3];
    nvmlReturn_t r;
    if (!mem)
        return E_INVALID_ARGUMENT;
    if ((r = memory(dev, "memory", v)) != OK)
        return r;
    mem->total = v[0];
    mem->used = v[1];
    mem->free = v[2];
    return OK;
}

#ifndef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *dev, struct memory_v2 *mem) {
    unsigned long long v[3];
    nvmlReturn_t r;
    if (!mem)
        return E_INVALID_ARGUMENT;
    /* The caller states the struct version: its size, and 2 in the top byte. */
    if (mem->version != (unsigned)(sizeof(struct memory_v2) | (2u << 24)))
        return E_ARGUMENT_VERSION_MISMATCH;
    if ((r = memory(dev, "memory", v)) != OK)
        return r;
    mem->total = v[0];
    mem->used = v[1];
    mem->free = v[2];
    mem->reserved = 0;
    return OK;
}
#endif

struct bar1 {
    unsigned long long total, free, used;
};

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(void *dev, struct bar1 *b) {
    unsigned long long v[3];
    nvmlReturn_t r;
    if (!b)
        return E_INVALID_ARGUMENT;
    if ((r = memory(dev, "bar1", v)) != OK)
        return r;
    b->total = v[0];
    b->used = v[1];
    b->free = v[2];
    return OK;
}

nvmlReturn_t nvmlDeviceGetTemperature(void *dev, unsigned sensor, unsigned *temp) {
    if (sensor != 0)
        return E_INVALID_ARGUMENT;
    return one_uint(dev, "temperature", temp);
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(void *dev, unsigned kind, unsigned *temp) {
    switch (kind) {
    case 0:
        return one_uint(dev, "temp_shutdown", temp);
    case 1:
        return one_uint(dev, "temp_slowdown", temp);
    case 3:
        return one_uint(dev, "temp_max_operating", temp);
    default:
        return E_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetPowerUsage(void *dev, unsigned *mw) {
    return one_uint(dev, "power", mw);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *dev, unsigned *mw) {
    return one_uint(dev, "power_limit", mw);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(void *dev, unsigned long long *mj) {
    struct entry *e;
    nvmlReturn_t r;
    if (!mj)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "energy", 1, &e)) != OK)
        return r;
    *mj = e->vals[0];
    return OK;
}

static const char *const clock_keys[4] = {"clock_graphics", "clock_sm", "clock_mem",
                                          "clock_video"};
static const char *const max_clock_keys[4] = {"clock_graphics_max", "clock_sm_max",
                                              "clock_mem_max", "clock_video_max"};

nvmlReturn_t nvmlDeviceGetClockInfo(void *dev, unsigned type, unsigned *mhz) {
    if (type > 3)
        return E_INVALID_ARGUMENT;
    return one_uint(dev, clock_keys[type], mhz);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(void *dev, unsigned type, unsigned *mhz) {
    if (type > 3)
        return E_INVALID_ARGUMENT;
    return one_uint(dev, max_clock_keys[type], mhz);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *dev, unsigned long long *bits) {
    struct entry *e;
    nvmlReturn_t r;
    if (!bits)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "throttle_reasons", 1, &e)) != OK)
        return r;
    *bits = e->vals[0];
    return OK;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(void *dev, unsigned counter, unsigned *kb) {
    if (counter > 1)
        return E_INVALID_ARGUMENT;
    return one_uint(dev, counter == 0 ? "pcie_tx" : "pcie_rx", kb);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(void *dev, unsigned *gen) {
    return one_uint(dev, "pcie_link_gen", gen);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(void *dev, unsigned *width) {
    return one_uint(dev, "pcie_link_width", width);
}

#ifndef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetNumFans(void *dev, unsigned *n) {
    struct entry *e;
    nvmlReturn_t r;
    if (!n)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "fan", 0, &e)) != OK)
        return r;
    *n = (unsigned)e->nvals;
    return OK;
}

nvmlReturn_t nvmlDeviceGetFanSpeed_v2(void *dev, unsigned fan, unsigned *pct) {
    struct entry *e;
    nvmlReturn_t r;
    if (!pct)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "fan", 1, &e)) != OK)
        return r;
    if (fan >= (unsigned)e->nvals)
        return E_INVALID_ARGUMENT;
    *pct = (unsigned)e->vals[fan];
    return OK;
}
#endif

/* The first fan only, as NVML answered before it counted fans. */
nvmlReturn_t nvmlDeviceGetFanSpeed(void *dev, unsigned *pct) { return one_uint(dev, "fan", pct); }

nvmlReturn_t nvmlDeviceGetEccMode(void *dev, unsigned *current, unsigned *pending) {
    struct entry *e;
    nvmlReturn_t r;
    if (!current || !pending)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "ecc", 1, &e)) != OK)
        return r;
    *current = *pending = e->vals[0] ? 1 : 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *dev, unsigned type, unsigned counter,
                                         unsigned long long *n) {
    struct entry *e;
    nvmlReturn_t r;
    if (!n || type > 1 || counter > 1)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "ecc", 3, &e)) != OK)
        return r;
    if (!e->vals[0])
        return E_NOT_SUPPORTED;
    *n = e->vals[1 + type];
    return OK;
}

/* ---- MIG ---- */

#ifndef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMigMode(void *dev, unsigned *current, unsigned *pending) {
    struct entry *e;
    nvmlReturn_t r;
    if (!current || !pending)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "mig_mode", 2, &e)) != OK)
        return r;
    *current = (unsigned)e->vals[0];
    *pending = (unsigned)e->vals[1];
    return OK;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *dev, unsigned *n) {
    struct entry *e;
    nvmlReturn_t r;
    if (!n)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "mig_mode", 2, &e)) != OK)
        return r;
    *n = MAX_MIGS;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *dev, unsigned index, void **mig) {
    struct gpu *g;
    int m;
    nvmlReturn_t r = device(dev, &g, &m);
    if (r != OK)
        return r;
    if (m >= 0 || !mig)
        return E_INVALID_ARGUMENT;
    if (index >= MAX_MIGS || !g->migs[index].present)
        return E_NOT_FOUND;
    *mig = &mig_handles[g - sc.gpus][index];
    return OK;
}
#endif

/* ---- processes ---- */

/* nvmlProcessInfo_t as the _v2 and _v3 calls fill it. */
struct process_info {
    unsigned pid;
    unsigned long long used;
    unsigned gpu_instance;
    unsigned compute_instance;
};

struct process_info_v1 {
    unsigned pid;
    unsigned long long used;
};

/* Lists the pid/bytes pairs of `key` into `out`, in the v1 or the v2 layout. */
static nvmlReturn_t processes(void *dev, const char *key, unsigned *n, void *out, int v1) {
    struct entry *e;
    nvmlReturn_t r;
    if (!n)
        return E_INVALID_ARGUMENT;
    r = lookup(dev, key, 0, &e);
    if (r == E_NOT_SUPPORTED && strcmp(key, "graphics_processes") == 0) {
        /* No graphics list given: none, where the GPU lists compute processes at all. */
        struct entry *c;
        nvmlReturn_t rc = lookup(dev, "processes", 0, &c);
        if (rc != OK)
            return rc;
        *n = 0;
        return OK;
    }
    if (r != OK)
        return r;
    unsigned have = (unsigned)e->nvals / 2;
    if (*n < have || (!out && have > 0)) {
        *n = have;
        return E_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < have; i++) {
        if (v1) {
            struct process_info_v1 *p = (struct process_info_v1 *)out + i;
            p->pid = (unsigned)e->vals[2 * i];
            p->used = e->vals[2 * i + 1];
        } else {
            struct process_info *p = (struct process_info *)out + i;
            p->pid = (unsigned)e->vals[2 * i];
            p->used = e->vals[2 * i + 1];
            p->gpu_instance = 0xFFFFFFFFu;
            p->compute_instance = 0xFFFFFFFFu;
        }
    }
    *n = have;
    return OK;
}

#ifndef OLD_DRIVER
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned *n,
                                                     struct process_info *p) {
    return processes(dev, "processes", n, p, 0);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(void *dev, unsigned *n,
                                                      struct process_info *p) {
    return processes(dev, "graphics_processes", n, p, 0);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *dev, unsigned *n,
                                                     struct process_info *p) {
    return processes(dev, "processes", n, p, 0);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(void *dev, unsigned *n,
                                                      struct process_info *p) {
    return processes(dev, "graphics_processes", n, p, 0);
}
#endif
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *dev, unsigned *n,
                                                  struct process_info_v1 *p) {
    return processes(dev, "processes", n, p, 1);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(void *dev, unsigned *n,
                                                   struct process_info_v1 *p) {
    return processes(dev, "graphics_processes", n, p, 1);
}

struct process_utilization {
    unsigned pid;
    unsigned long long timestamp;
    unsigned sm, mem, enc, dec;
};

/* One sample per listed process, stamped after the newest the caller has seen. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(void *dev, struct process_utilization *out,
                                             unsigned *n, unsigned long long last_seen) {
    struct entry *e;
    nvmlReturn_t r;
    if (!n)
        return E_INVALID_ARGUMENT;
    if ((r = lookup(dev, "process_utilization", 0, &e)) != OK)
        return r;
    unsigned have = (unsigned)e->nvals / 3;
    if (have == 0)
        return E_NOT_FOUND;
    if (!out || *n < have) {
        *n = have;
        return E_INSUFFICIENT_SIZE;
    }
    int m;
    int g = resolve(dev, &m);
    unsigned long long ts = util_clock[g] > last_seen ? util_clock[g] : last_seen;
    util_clock[g] = ts + 1000;
    for (unsigned i = 0; i < have; i++) {
        out[i].pid = (unsigned)e->vals[3 * i];
        out[i].timestamp = ts + 1000;
        out[i].sm = (unsigned)e->vals[3 * i + 1];
        out[i].mem = (unsigned)e->vals[3 * i + 2];
        out[i].enc = 0;
        out[i].dec = 0;
    }
    *n = have;
    return OK;
}
