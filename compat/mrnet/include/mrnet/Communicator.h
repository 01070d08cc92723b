/* mrnet/Communicator.h: a set of back-end ranks streams are made over. */
#if !defined(__communicator_h)
#define __communicator_h 1

#include <set>
#include <string>

#include "mrnet/CommunicationNode.h"
#include "mrnet/Types.h"

namespace MRN {

class Network;

class Communicator {
    friend class Stream;
    friend class Network;

 public:
    bool add_EndPoint(Rank irank);
    bool add_EndPoint(CommunicationNode *);
    const std::set<CommunicationNode *> &get_EndPoints() const { return _back_ends; }
    unsigned size(void) const { return (unsigned)_back_ends.size(); }
    ~Communicator();

 private:
    Communicator(Network *, const std::set<Rank> &);
    Network *_network;
    std::set<CommunicationNode *> _back_ends;
    std::set<Rank> _ranks;
};

} /* namespace MRN */

#endif /* __communicator_h */
