/* xplat_lightweight.cpp: libxplat_lightweight's host names, in C, over XPlat::NetUtils. */
#include <string.h>

#include <string>

#include "xplat/NetUtils.h"
#include "xplat_lightweight/NetUtils.h"

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

}  // extern "C"
