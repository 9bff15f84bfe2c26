/* A slow disk for benchmarks, in the agent's own process: LD_PRELOAD this library and every
 * fsync/fdatasync waits SLOW_SYNC_US microseconds (default 10000: a managed-flash cache flush)
 * and every pwrite/pwrite64/write to a regular file SLOW_WRITE_US (default 200) before doing
 * the real call. Reads and everything else run at full speed. Only for benches/slow_disk.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static long env_us(const char *name, long dflt) {
    const char *v = getenv(name);
    return v ? atol(v) : dflt;
}

static void pause_us(long us) {
    if (us <= 0) return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int regular(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    pause_us(env_us("SLOW_SYNC_US", 10000));
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    pause_us(env_us("SLOW_SYNC_US", 10000));
    return real(fd);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (!real) real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    if (regular(fd)) pause_us(env_us("SLOW_WRITE_US", 200));
    return real(fd, buf, n, off);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    return pwrite64(fd, buf, n, off);
}
