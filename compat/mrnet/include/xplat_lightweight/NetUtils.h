/* xplat_lightweight/NetUtils.h: host names as MRNet's lightweight xplat library gives
 * them (libxplat_lightweight), kept whole, dots included. Each returns 0 on success;
 * the output buffers hold XPLAT_MAX_HOSTNAME_LEN bytes. */
#ifndef XPLAT_LIGHTWEIGHT_NETUTILS_H
#define XPLAT_LIGHTWEIGHT_NETUTILS_H

#include "xplat_lightweight/Types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The canonical name of a host (as given when it does not resolve). */
int XPlat_NetUtils_GetHostName(char *ihostname, char *ohostname);
/* The name other hosts reach `ihostname` by: its canonical name. */
int XPlat_NetUtils_FindNetworkName(char *ihostname, char *ohostname);
/* This host's name. */
int XPlat_NetUtils_GetLocalHostName(char *this_host);
/* The errno (or resolver code) of the last call that failed. */
int XPlat_NetUtils_GetLastError(void);

#ifdef __cplusplus
}
#endif

#endif /* XPLAT_LIGHTWEIGHT_NETUTILS_H */
