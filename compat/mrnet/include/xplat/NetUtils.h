/* xplat/NetUtils.h: host names and addresses as MRNet's xplat library gives them
 * (libxplat; treecast's MRNet-compatible layer, docs/mrnet-compat.md). Host names
 * are kept whole, dots included. */
#ifndef XPLAT_NETUTILS_H
#define XPLAT_NETUTILS_H

#include <string>
#include <vector>
#include <netinet/in.h>
#include <arpa/inet.h>

#include "xplat/Types.h"

namespace XPlat {

class NetUtils {
 public:
    /* An IPv4 or IPv6 address with its text form. */
    class NetworkAddress {
     public:
        NetworkAddress() : isv6(false), ip4addr(INADDR_ANY), ip6addr(in6addr_any) {}
        explicit NetworkAddress(in_addr_t inaddr);
        explicit NetworkAddress(struct sockaddr_in6 *inaddr);
        /* The address as text ("10.0.0.1"). */
        std::string GetString() const { return str; }
        /* The IPv4 address, in network byte order. */
        in_addr_t GetInAddr() const { return ip4addr; }
        bool IsV6() const { return isv6; }
        bool operator==(const NetworkAddress &o) const { return str == o.str; }
     private:
        bool isv6;
        in_addr_t ip4addr;
        struct in6_addr ip6addr;
        std::string str;
    };

    static bool IsIPAddressStr(std::string &iaddr);
    /* The canonical name of a host; 0 on success. */
    static int GetHostName(std::string ihostname, std::string &ohostname);
    static int GetNetworkName(std::string ihostname, std::string &ohostname);
    static int GetNetworkAddress(std::string ihostname, NetworkAddress &oaddr);
    static int GetNumberOfNetworkInterfaces(void);
    static int GetLocalNetworkInterfaces(std::vector<NetworkAddress> &oaddrs);
    /* This host's name, whole; 0 on success. */
    static int GetLocalHostName(std::string &this_host);
    static bool IsLocalHost(const std::string &host);
    static int GetLastError(void);
};

} /* namespace XPlat */

#endif /* XPLAT_NETUTILS_H */
