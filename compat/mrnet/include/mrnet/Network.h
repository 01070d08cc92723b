/* mrnet/Network.h: the front-end's or back-end's view of the tree, over treecast's C
 * API (include/treecast.h). Differences from MRNet: docs/mrnet-compat.md. */
#if !defined(__network_h)
#define __network_h 1

#include <iostream>
#include <list>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "mrnet/Communicator.h"
#include "mrnet/Error.h"
#include "mrnet/Event.h"
#include "mrnet/FilterIds.h"
#include "mrnet/NetworkTopology.h"
#include "mrnet/Packet.h"
#include "mrnet/Tree.h"
#include "mrnet/Types.h"

namespace MRN {

class Stream;
struct NetworkImpl;

class Network : public Error {
    friend class Stream;
    friend class Communicator;

 public:
    /* Launches the tree of `itopology` (an MRNet topology file) with `ibackend_exe`
     * and its arguments (NULL-terminated) at the leaves. A NULL back-end is attach
     * mode: the comm nodes only; the tool starts the back-ends under the leaves
     * (get_Leaves) with MRNet's arguments, TREECAST_MRNET_BACKENDS of them
     * (docs/mrnet-compat.md). */
    static Network *CreateNetworkFE(const char *itopology, const char *ibackend_exe, const char **ibackend_argv,
                                    const std::map<std::string, std::string> *attrs = NULL,
                                    bool irank_backends = true, bool iusing_mem_buf = false);
    /* Joins as a back-end: launched by the tree (its environment), or by MRNet's
     * arguments (parent host, port, rank, own host, own rank) with the secret from
     * the attach file in TREECAST_ATTACH. */
    static Network *CreateNetworkBE(int argc, char *argv[]);
    /* Runs this process as a comm node, for a tool's own comm node program (named by
     * MRNET_COMM_PATH; treecast starts it as `PROGRAM node`): treecast's comm node runs
     * on a thread of its own until the tree ends; waitfor_ShutDown waits for that,
     * and so does `delete`. The arguments are not read. */
    static Network *CreateNetworkIN(int argc, char *argv[]);

    NetworkTopology *get_NetworkTopology(void) const;
    bool is_ShutDown(void) const;
    void waitfor_ShutDown(void) const;
    void print_error(const char *);

    std::string get_LocalHostName(void) const;
    Port get_LocalPort(void) const;
    Rank get_LocalRank(void) const;
    bool is_LocalNodeChild(void) const;
    bool is_LocalNodeParent(void) const;
    bool is_LocalNodeInternal(void) const;
    bool is_LocalNodeFrontEnd(void) const;
    bool is_LocalNodeBackEnd(void) const;

    Communicator *get_BroadcastCommunicator(void) const;
    Communicator *new_Communicator(void);
    Communicator *new_Communicator(Communicator &);
    Communicator *new_Communicator(const std::set<Rank> &);
    Communicator *new_Communicator(std::set<CommunicationNode *> &);
    CommunicationNode *get_EndPoint(Rank) const;

    /* Loads an MRNet filter function from `so_file`: it runs at every comm node and
     * at the front-end through treecast's adapter plug-in; the object's bytes are
     * shipped down the tree (no shared file system needed). -1 on failure. */
    int load_FilterFunc(const char *so_file, const char *func);
    int load_FilterFuncs(const char *so_file, const std::vector<const char *> &functions,
                         std::vector<int> &filter_ids);

    Stream *new_Stream(Communicator *, int us_filter_id = TFILTER_NULL, int sync_id = SFILTER_WAITFORALL,
                       int ds_filter_id = TFILTER_NULL);
    Stream *get_Stream(unsigned int iid) const;
    /* A packet from any stream: 1 with one, 0 when none (not blocking) or a stream
     * closed (back-end), -1 on failure or once the tree is over. */
    int recv(int *otag, PacketPtr &opacket, Stream **ostream, bool iblocking = true);
    int send(Rank ibe, int itag, const char *iformat_str, ...);
    int send(Rank ibe, const char *idata_fmt, va_list idata, int itag);
    int send(Rank ibe, int itag, const void **idata, const char *iformat_str);
    int send(Rank ibe, PacketPtr &ipacket);
    int flush(void) const;

    bool enable_PerformanceData(perfdata_metric_t, perfdata_context_t) { return false; }
    bool disable_PerformanceData(perfdata_metric_t, perfdata_context_t) { return false; }

    void clear_Events();
    unsigned int num_EventsPending();
    /* The oldest queued event, now the caller's: `delete e->get_Data(); delete e;`
     * (as in MRNet, ~Event leaves its data alone). NULL when none. */
    Event *next_Event();
    int get_EventNotificationFd(EventClass etyp);
    void clear_EventNotificationFd(EventClass etyp);
    void close_EventNotificationFd(EventClass etyp);
    bool register_EventCallback(EventClass iclass, EventType ityp, evt_cb_func ifunc, void *idata,
                                bool onetime = false);
    bool remove_EventCallback(evt_cb_func func, EventClass iclass, EventType ityp);
    bool remove_EventCallbacks(EventClass iclass, EventType ityp);
    /* treecast recovers lost comm nodes' children always: false is accepted and
     * changes nothing (docs/mrnet-compat.md). */
    bool set_FailureRecovery(bool enable_recovery);

    virtual ~Network();

 private:
    Network(void);
    Network(const Network &);
    Network &operator=(const Network &);
    /* CreateNetworkFE without a back-end program; false (with the error set) on failure. */
    bool create_attached(const char *itopology, const std::map<std::string, std::string> *attrs);
    NetworkImpl *_impl;
};

} /* namespace MRN */

#endif /* __network_h */
