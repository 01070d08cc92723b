/* xplat_lightweight.cpp: libxplat_lightweight's host names, in C, over XPlat::NetUtils,
 * and its threads, over POSIX threads. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <string>

#include "xplat/NetUtils.h"
#include "xplat_lightweight/NetUtils.h"
#include "xplat_lightweight/Thread.h"

static_assert(sizeof(pthread_t) <= sizeof(Thread_Id), "a pthread_t fits in a Thread_Id");

namespace XPlat {
/* xplat.cpp's: starts a thread with asynchronous signals blocked. */
int thread_start_quiet(pthread_t *t, void *(*func)(void *), void *data);
}

namespace {

/* Copies a host name into a caller's buffer of XPLAT_MAX_HOSTNAME_LEN bytes. */
int give(const std::string &name, char *out) {
    if (!out) return -1;
    size_t n = name.size() < XPLAT_MAX_HOSTNAME_LEN - 1 ? name.size() : XPLAT_MAX_HOSTNAME_LEN - 1;
    memcpy(out, name.data(), n);
    out[n] = '\0';
    return 0;
}

}  // namespace

extern "C" {

int XPlat_NetUtils_GetHostName(char *ihostname, char *ohostname) {
    std::string out;
    if (!ihostname || XPlat::NetUtils::GetHostName(ihostname, out) != 0) return -1;
    return give(out, ohostname);
}

int XPlat_NetUtils_FindNetworkName(char *ihostname, char *ohostname) {
    std::string out;
    if (!ihostname || XPlat::NetUtils::GetNetworkName(ihostname, out) != 0) return -1;
    return give(out, ohostname);
}

int XPlat_NetUtils_GetLocalHostName(char *this_host) {
    std::string out;
    if (XPlat::NetUtils::GetLocalHostName(out) != 0) return -1;
    return give(out, this_host);
}

int XPlat_NetUtils_GetLastError(void) { return XPlat::NetUtils::GetLastError(); }

int Thread_Create(Thread_Func func, void *data, Thread_Id *id) {
    if (!func || !id) return EINVAL;
    pthread_t t;
    int rc = XPlat::thread_start_quiet(&t, func, data);
    if (rc == 0) *id = (Thread_Id)t;
    return rc;
}

Thread_Id Thread_GetId(void) { return (Thread_Id)pthread_self(); }

int Thread_Join(Thread_Id joinWith, void **exitValue) {
    return joinWith == 0 ? EINVAL : pthread_join((pthread_t)joinWith, exitValue);
}

int Thread_Cancel(Thread_Id id) { return id == 0 ? EINVAL : pthread_cancel((pthread_t)id); }

void Thread_Exit(void *val) { pthread_exit(val); }

}  // extern "C"
