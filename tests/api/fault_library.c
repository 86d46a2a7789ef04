/* Faults of the machine, for tests: built as a shared library and preloaded
 * into a `holdfast` process (LD_PRELOAD) by helpers.rs `fault_library`.
 *
 * FAULT_SLOW_SYNC_FILE      a path: while a file exists there, every fsync
 *                           and fdatasync first waits 1.5 s (a slow disk).
 * FAULT_CLOCK_SHIFT_SECONDS seconds added to the wall clock (CLOCK_REALTIME),
 *                           as a clock set wrong would; the monotonic clock,
 *                           which timers use, is left alone.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void slow_disk(void) {
    const char *flag = getenv("FAULT_SLOW_SYNC_FILE");
    if (flag && access(flag, F_OK) == 0) {
        usleep(1500 * 1000);
    }
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    }
    slow_disk();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    slow_disk();
    return real(fd);
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) {
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    }
    int rc = real(clock, ts);
    const char *shift = getenv("FAULT_CLOCK_SHIFT_SECONDS");
    if (rc == 0 && shift && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        ts->tv_sec += atol(shift);
    }
    return rc;
}
