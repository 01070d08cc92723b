/* mrnet/CommunicationNode.h: an end point (a back-end) of a communicator. */
#if !defined(__communicationnode_h)
#define __communicationnode_h 1

#include <string>

#include "mrnet/Types.h"

namespace MRN {

class CommunicationNode {
 public:
    std::string get_HostName(void) const { return _hostname; }
    Port get_Port(void) const { return _port; }
    Rank get_Rank(void) const { return _rank; }
    CommunicationNode(std::string const &ihostname, Port iport, Rank irank)
        : _hostname(ihostname), _port(iport), _rank(irank) {}
    ~CommunicationNode() {}

 private:
    std::string _hostname;
    Port _port;
    Rank _rank;
};

} /* namespace MRN */

#endif /* __communicationnode_h */
