/* mrnet/Stream.h: a communicator bound to filters, over a treecast stream. */
#if !defined(__stream_h)
#define __stream_h 1

#include <atomic>
#include <cstdarg>
#include <deque>
#include <set>
#include <vector>

#include "mrnet/FilterIds.h"
#include "mrnet/Network.h"
#include "mrnet/Packet.h"

struct tc_stream;
struct tc_value;

namespace MRN {

struct NetworkImpl;
struct PrivateStreams;
class Stream;
/* The layer's own: a back-end's Stream of an id, made when first seen. */
Stream *be_stream(Network *n, NetworkImpl *impl, unsigned int id);
/* The layer's own: a back-end takes what arrived (waiting up to wait_ms). */
int be_poll(Network *n, NetworkImpl *impl, PacketPtr &out, unsigned int &closed, uint64_t wait_ms);
/* The layer's own: the front-end's stream of point-to-point sends, made in the tree once. */
Stream *p2p_stream(Network *n, NetworkImpl *impl);
/* The layer's own: the front-end's private stream of a back-end, made at first use. */
Stream *fe_private(Network *n, NetworkImpl *impl, Rank rank);

typedef enum { FILTER_DOWNSTREAM_TRANS, FILTER_UPSTREAM_TRANS, FILTER_UPSTREAM_SYNC } FilterType;

#define INVALID_STREAM_ID ((unsigned int)-1)

/* As MRNet numbers streams: a user stream's id is USER_STRM_BASE_ID or more; a
 * back-end's private stream (Network::send to one rank) has the back-end's rank. */
extern const unsigned int CTL_STRM_ID;
extern const unsigned int TOPOL_STRM_ID;
extern const unsigned int USER_STRM_BASE_ID;

class Stream {
    friend class Network;
    friend Stream *be_stream(Network *n, NetworkImpl *impl, unsigned int id);
    friend int be_poll(Network *n, NetworkImpl *impl, PacketPtr &out, unsigned int &closed, uint64_t wait_ms);
    friend Stream *p2p_stream(Network *n, NetworkImpl *impl);
    friend Stream *fe_private(Network *n, NetworkImpl *impl, Rank rank);
    friend struct PrivateStreams;

 public:
    int send(int itag, const char *iformat_str, ...);
    int send(const char *idata_fmt, va_list idata, int itag);
    int send(int itag, const void **idata, const char *iformat_str);
    int send(PacketPtr &ipacket);
    int flush(void) const;
    int recv(int *otag, PacketPtr &opacket, bool iblocking = true);
    const std::set<Rank> &get_EndPoints(void) const { return _ranks; }
    unsigned int get_Id(void) const;
    unsigned int size(void) const { return (unsigned int)_ranks.size(); }
    bool has_Data(void);
    int get_DataNotificationFd(void);
    void clear_DataNotificationFd(void);
    void close_DataNotificationFd(void);
    int set_FilterParameters(FilterType ftype, const char *format_str, ...) const;
    int set_FilterParameters(const char *params_fmt, va_list params, FilterType ftype) const;
    bool enable_PerformanceData(perfdata_metric_t, perfdata_context_t) { return false; }
    bool disable_PerformanceData(perfdata_metric_t, perfdata_context_t) { return false; }
    bool is_Closed(void) const;
    bool is_ShutDown(void) const { return is_Closed(); }
    ~Stream();

 private:
    Stream(Network *net, unsigned int id, const std::set<Rank> &ranks, int us, int sync, int ds);
    /* Makes the treecast stream at first use (so that filter parameters and the
     * time-out set before it are part of its creation); false on failure. */
    bool ensure(void) const;
    int send_packet(Packet &p);
    /* The variadic send's work: values straight from `ap` into treecast's value array. */
    int send_va(int itag, const char *iformat_str, va_list *ap);
    /* The front-end's send of values (to the private stream's rank, or to all). */
    int fe_send(int itag, const char *fmt, const struct tc_value *vals, size_t count);
    /* A front-end private stream's receive. */
    int private_recv(int *otag, PacketPtr &opacket, bool iblocking);
    Network *_network;
    mutable struct tc_stream *_tc;
    mutable unsigned int _id;
    mutable std::set<Rank> _ranks; /* a broadcast stream's: taken when it is made */
    bool _broadcast;               /* over the broadcast communicator (grows in attach mode) */
    int _us_filter, _sync_filter, _ds_filter;
    mutable uint32_t _sync_timeout_ms;
    mutable PacketPtr _up_params, _down_params;
    /* set by whichever thread sees the closing (a receive, is_Closed), read by any */
    mutable std::atomic<bool> _closed;
    /* front-end: a back-end's private stream (Network::get_Stream(rank)): `_id` is the
     * rank, and its packets go and come over the network's one point-to-point stream */
    bool _private;
    /* back-end: packets received for this stream; front-end: a private stream's packets
     * taken from the point-to-point stream by a receive for another one */
    std::deque<PacketPtr> _pending;
};

} /* namespace MRN */

#endif /* __stream_h */
