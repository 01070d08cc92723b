/* xplat.cpp: XPlat::NetUtils (libxplat): host names kept whole, addresses; and
 * XPlat::Thread over POSIX threads. */
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xplat/NetUtils.h"
#include "xplat/Thread.h"

namespace XPlat {

static int last_error = 0;

NetUtils::NetworkAddress::NetworkAddress(in_addr_t inaddr) : isv6(false), ip4addr(inaddr), ip6addr(in6addr_any) {
    char buf[INET_ADDRSTRLEN] = {0};
    struct in_addr a;
    a.s_addr = inaddr;
    inet_ntop(AF_INET, &a, buf, sizeof buf);
    str = buf;
}

NetUtils::NetworkAddress::NetworkAddress(struct sockaddr_in6 *inaddr) : isv6(true), ip4addr(INADDR_ANY) {
    char buf[INET6_ADDRSTRLEN] = {0};
    ip6addr = inaddr ? inaddr->sin6_addr : in6addr_any;
    inet_ntop(AF_INET6, &ip6addr, buf, sizeof buf);
    str = buf;
}

bool NetUtils::IsIPAddressStr(std::string &iaddr) {
    struct in_addr a;
    struct in6_addr b;
    return inet_pton(AF_INET, iaddr.c_str(), &a) == 1 || inet_pton(AF_INET6, iaddr.c_str(), &b) == 1;
}

int NetUtils::GetLocalHostName(std::string &this_host) {
    char buf[XPLAT_MAX_HOSTNAME_LEN + 1] = {0};
    if (gethostname(buf, XPLAT_MAX_HOSTNAME_LEN) != 0) {
        last_error = errno;
        return -1;
    }
    this_host = buf;
    return 0;
}

int NetUtils::GetHostName(std::string ihostname, std::string &ohostname) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_CANONNAME;
    hints.ai_family = AF_UNSPEC;
    if (getaddrinfo(ihostname.c_str(), NULL, &hints, &res) != 0 || !res) {
        ohostname = ihostname; /* unresolvable: the name as given, whole */
        return 0;
    }
    ohostname = res->ai_canonname ? res->ai_canonname : ihostname;
    freeaddrinfo(res);
    return 0;
}

int NetUtils::GetNetworkName(std::string ihostname, std::string &ohostname) { return GetHostName(ihostname, ohostname); }

int NetUtils::GetNetworkAddress(std::string ihostname, NetworkAddress &oaddr) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    int rc = getaddrinfo(ihostname.c_str(), NULL, &hints, &res);
    if (rc != 0 || !res) {
        last_error = rc;
        return -1;
    }
    oaddr = NetworkAddress(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr);
    freeaddrinfo(res);
    return 0;
}

int NetUtils::GetLocalNetworkInterfaces(std::vector<NetworkAddress> &oaddrs) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) {
        last_error = errno;
        return -1;
    }
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET)
            oaddrs.push_back(NetworkAddress(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr));
    freeifaddrs(ifs);
    return (int)oaddrs.size();
}

int NetUtils::GetNumberOfNetworkInterfaces(void) {
    std::vector<NetworkAddress> v;
    return GetLocalNetworkInterfaces(v);
}

bool NetUtils::IsLocalHost(const std::string &host) {
    if (host == "localhost") return true;
    std::string me;
    if (GetLocalHostName(me) == 0 && me == host) return true;
    NetworkAddress a;
    if (GetNetworkAddress(host, a) != 0) return false;
    if ((ntohl(a.GetInAddr()) >> 24) == 127) return true;
    std::vector<NetworkAddress> mine;
    GetLocalNetworkInterfaces(mine);
    for (size_t i = 0; i < mine.size(); i++)
        if (mine[i] == a) return true;
    return false;
}

int NetUtils::GetLastError(void) { return last_error; }

static_assert(sizeof(pthread_t) <= sizeof(Thread::Id), "a pthread_t fits in a Thread::Id");

/* Starts `func(data)` with asynchronous signals blocked, as MRNet's threads start: a
 * tool's signals go to its own threads, not to the helpers it started. */
static int start_quiet(pthread_t *t, void *(*func)(void *), void *data) {
    sigset_t quiet, old;
    sigfillset(&quiet);
    const int synchronous[] = {SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGSYS, SIGFPE, SIGPROF, SIGTERM};
    for (size_t i = 0; i < sizeof synchronous / sizeof synchronous[0]; i++) sigdelset(&quiet, synchronous[i]);
    pthread_sigmask(SIG_BLOCK, &quiet, &old);
    int rc = pthread_create(t, NULL, func, data);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

int Thread::Create(Func func, void *data, Id *id) {
    if (!func || !id) return EINVAL;
    pthread_t t;
    int rc = start_quiet(&t, func, data);
    if (rc == 0) *id = (Id)t;
    return rc;
}

Thread::Id Thread::GetId(void) { return (Id)pthread_self(); }

/* Id 0 (a Create that failed) is refused, as MRNet's: pthread_join would crash on it. */
int Thread::Join(Id joinWith, void **exitValue) {
    return joinWith == 0 ? EINVAL : pthread_join((pthread_t)joinWith, exitValue);
}

int Thread::Cancel(Id id) { return id == 0 ? EINVAL : pthread_cancel((pthread_t)id); }

int thread_start_quiet(pthread_t *t, void *(*func)(void *), void *data) { return start_quiet(t, func, data); }

void Thread::Exit(void *val) { pthread_exit(val); }

}  // namespace XPlat
