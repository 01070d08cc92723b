/* network.cpp: Network, Stream, Communicator and NetworkTopology over treecast's C
 * API (include/treecast.h). See docs/mrnet-compat.md for what differs from MRNet. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "internal.h"
#include "mrnet/MRNet.h"
#include "treecast.h"

#ifndef MRN_PREFIX
#define MRN_PREFIX ""
#endif

namespace MRN {

using namespace compat;

const unsigned int CTL_STRM_ID = 1u << 30;
const unsigned int TOPOL_STRM_ID = (1u << 30) + 1;
const unsigned int USER_STRM_BASE_ID = STREAM_ID_BASE;

/* Ranks of the front-end and comm nodes: this plus their pre-order node id, so that
 * they never meet the back-ends' ranks (0 .. N-1, treecast's). */
static const Rank INTERNAL_RANK_BASE = 1000000;
/* First id of a filter loaded by load_FilterFunc. */
static const int FIRST_LOADED_FILTER = 100;
/* How long one wait lasts before a blocking call looks again (ms). */
static const uint64_t SLICE_MS = 1000;

/* An MRNet filter function loaded by load_FilterFunc. */
struct LoadedFilter {
    std::string func;
    std::string identity;
    std::vector<uint8_t> bytes;
};

/* Front-end attach mode (CreateNetworkFE without a back-end program): where the
 * launch stands. */
enum AttachState { ATTACH_NONE, ATTACH_WAITING, ATTACH_DONE, ATTACH_FAILED };

struct NetworkImpl {
    bool fe;
    /* Set once: by CreateNetworkFE, or in attach mode by the launching thread when the
     * last back-end attached; read without the lock. */
    std::atomic<tc_network *> net;
    tc_backend *be;
    std::atomic<int> data_fd; /* set under mu, read by receives without it */
    Rank rank;
    std::string host;
    std::mutex mu;
    std::mutex make_mu; /* one thread at a time makes a front-end stream (Stream::ensure) */
    std::map<unsigned int, Stream *> streams; /* made (front-end) or seen (back-end) */
    std::list<Stream *> all_streams;          /* front-end: every live Stream object */
    std::list<Communicator *> comms;
    Communicator *bcast;
    NetworkTopology *topo;
    /* a deque: streams keep pointers to its entries while load_FilterFunc adds more */
    std::deque<LoadedFilter> filters;
    bool adapter_loaded;
    /* front-end: the stream of Network::send to one rank. Made once, under p2p_mu (so
     * two sending threads make one); the pointer is read and cleared under mu. */
    Stream *p2p;
    std::mutex p2p_mu;
    /* front-end: the back-ends' private streams (get_Stream(rank)), made at first use,
     * under mu */
    std::map<Rank, Stream *> privates;
    /* front-end: the private streams' descriptor, an epoll set of the point-to-point
     * stream's descriptor and `parked_fd`, signalled while a private stream holds a
     * packet taken from it (made at first use, under mu; -1 until then) */
    int private_fd;
    int parked_fd;
    /* front-end: where Network::recv looks first (a fairness hint: any value is safe) */
    std::atomic<size_t> next_stream;
    /* front-end: back-ends lost or gone for good (from the event thread, under mu) */
    std::set<Rank> gone;
    /* back-end: closings taken from treecast that go after the packet taken with them
     * (under mu) */
    std::deque<unsigned int> closed_later;
    std::atomic<bool> shutdown;
    std::atomic<bool> stop;
    /* when a flush last waited for the write (ns on now_ns's clock; Network::flush) */
    std::atomic<int64_t> last_flush_ns;
    std::thread events;
    std::list<Event *> queue;
    std::map<EventClass, std::map<EventType, evt_cb_list> > callbacks;
    std::map<EventClass, int[2]> pipes;
    bool events_wanted; /* under mu: the event thread starts when the network is there */
    /* Attach mode: the thread that runs treecast's launch until every back-end attached
     * (state under mu, waited for on `attached`), the private folder of the attach
     * file, the number of back-ends and how long they may take. */
    std::thread launching;
    AttachState attach;
    std::condition_variable attached;
    std::string attach_dir, attach_error;
    uint32_t attach_backends;
    uint64_t attach_ms;
    /* A comm node (CreateNetworkIN): treecast's comm node runs on this thread until
     * the tree ends; shutdown is set then. */
    bool internal;
    std::thread comm_node;

    NetworkImpl()
        : fe(false), net(NULL), be(NULL), data_fd(-1), rank(UnknownRank), bcast(NULL), topo(NULL),
          adapter_loaded(false), p2p(NULL), private_fd(-1), parked_fd(-1), next_stream(0), shutdown(false), stop(false),
          last_flush_ns(INT64_MIN / 2), events_wanted(false), attach(ATTACH_NONE), attach_backends(0),
          attach_ms(0), internal(false) {}
};

/* Attach mode: waits until every back-end attached (or the launch failed); true when
 * the network is there. Outside attach mode: whether there is a network. */
static bool wait_attached(NetworkImpl *impl) {
    std::unique_lock<std::mutex> g(impl->mu);
    /* the launch ends by itself within its limit; this bound only guards against a
     * launch that never returns */
    std::chrono::steady_clock::time_point until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(impl->attach_ms + 120000);
    while (impl->attach == ATTACH_WAITING && !impl->stop)
        if (impl->attached.wait_until(g, until) == std::cv_status::timeout) break;
    return impl->net.load() != NULL;
}

/* ---- helpers ---- */

static void fail(const Error *who, ErrorCode code, const char *what) {
    const char *why = tc_last_error();
    who->error(code, UnknownRank, "%s: %s", what, why && *why ? why : "no reason given");
    if (CUR_OUTPUT_LEVEL >= 1) fprintf(stderr, "mrnet: %s: %s\n", what, why && *why ? why : "no reason given");
}

static std::string local_host_name() {
    char buf[XPLAT_MAX_HOSTNAME_LEN + 1] = {0};
    if (gethostname(buf, XPLAT_MAX_HOSTNAME_LEN) != 0) return "localhost";
    return buf;
}

/* "0-3,8": a rank set as treecast's calls take it. */
static std::string fold(const std::set<Rank> &ranks) {
    std::string out;
    std::set<Rank>::const_iterator it = ranks.begin();
    while (it != ranks.end()) {
        Rank first = *it, last = *it;
        ++it;
        while (it != ranks.end() && *it == last + 1) last = *it++;
        char buf[32];
        if (first == last)
            snprintf(buf, sizeof buf, "%u", first);
        else
            snprintf(buf, sizeof buf, "%u-%u", first, last);
        if (!out.empty()) out += ',';
        out += buf;
    }
    return out;
}

/* Every value of `p`, as treecast's value array; borrowed from `p`. */
static void to_values(const Packet &p, std::vector<tc_value> &vals) {
    vals.resize(p.get_NumDataElements());
    for (unsigned int i = 0; i < p.get_NumDataElements(); i++) {
        const DataElement *e = p[i];
        tc_value &v = vals[i];
        memset(&v, 0, sizeof v);
        DataType t = e->get_Type();
        v.kind = tc_code(t);
        switch (t) {
        case CHAR_T: v.i = e->get_char(); break;
        case UCHAR_T: v.u = e->get_uchar(); break;
        case INT16_T: v.i = e->get_int16_t(); break;
        case UINT16_T: v.u = e->get_uint16_t(); break;
        case INT32_T: v.i = e->get_int32_t(); break;
        case UINT32_T: v.u = e->get_uint32_t(); break;
        case INT64_T: v.i = e->get_int64_t(); break;
        case UINT64_T: v.u = e->get_uint64_t(); break;
        case FLOAT_T: v.d = e->get_float(); break;
        case DOUBLE_T: v.d = e->get_double(); break;
        case STRING_T: v.ptr = e->get_string(); break;
        default: {
            uint64_t n = 0;
            v.ptr = e->get_array(NULL, &n);
            v.len = (size_t)n;
        }
        }
    }
}

/* A packet from a treecast packet (which the caller still frees). */
static PacketPtr from_tc(const tc_packet *tp) {
    PacketPtr p(new Packet(tc_packet_rank(tp), compat::mrn_stream_id(tc_packet_stream(tp)), tc_packet_tag(tp)));
    size_t n = tc_packet_count(tp);
    for (size_t i = 0; i < n; i++) {
        uint32_t code = tc_packet_type(tp, i);
        DataType t = from_tc_code(code);
        DataElement *e = new DataElement;
        int64_t s = 0;
        uint64_t u = 0;
        double d = 0;
        switch (t) {
        case CHAR_T: tc_packet_get_i64(tp, i, &s); e->set_char((char)s); break;
        case UCHAR_T: tc_packet_get_u64(tp, i, &u); e->set_uchar((unsigned char)u); break;
        case INT16_T: tc_packet_get_i64(tp, i, &s); e->set_int16_t((int16_t)s); break;
        case UINT16_T: tc_packet_get_u64(tp, i, &u); e->set_uint16_t((uint16_t)u); break;
        case INT32_T: tc_packet_get_i64(tp, i, &s); e->set_int32_t((int32_t)s); break;
        case UINT32_T: tc_packet_get_u64(tp, i, &u); e->set_uint32_t((uint32_t)u); break;
        case INT64_T: tc_packet_get_i64(tp, i, &s); e->set_int64_t(s); break;
        case UINT64_T: tc_packet_get_u64(tp, i, &u); e->set_uint64_t(u); break;
        case FLOAT_T: tc_packet_get_f64(tp, i, &d); e->set_float((float)d); break;
        case DOUBLE_T: tc_packet_get_f64(tp, i, &d); e->set_double(d); break;
        case STRING_T: {
            const char *str = "";
            tc_packet_get_string(tp, i, &str, NULL);
            e->set_string(str);
            break;
        }
        default: {
            const void *data = NULL;
            size_t len = 0;
            tc_packet_get_array(tp, i, NULL, &data, &len);
            e->set_array(data, t, (uint64_t)len);
        }
        }
        p->add_DataElement(e);
    }
    return p;
}

/* A host this process can start processes on itself (MRNet forks those). */
static bool is_local_host(const std::string &host) {
    std::string me = local_host_name();
    if (host == "localhost" || host == me || me.compare(0, host.size() + 1, host + ".") == 0 ||
        host.compare(0, me.size() + 1, me + ".") == 0)
        return true;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    if (getaddrinfo(host.c_str(), NULL, &hints, &res) != 0 || !res) return false;
    bool loopback = (ntohl(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    freeaddrinfo(res);
    return loopback;
}

/* Whether every host a topology file names is this one. */
static bool all_hosts_local(const char *path) {
    std::ifstream f(path ? path : "");
    std::string line;
    while (std::getline(f, line)) {
        std::string::size_type hash = line.find('#');
        if (hash != std::string::npos) line.erase(hash);
        std::istringstream words(line);
        std::string w;
        while (words >> w) {
            std::string::size_type colon = w.rfind(':');
            if (colon == std::string::npos || colon == 0) continue;
            if (!is_local_host(w.substr(0, colon))) return false;
        }
    }
    return true;
}

/* The data descriptor, made when first asked for (until then no packet pays for
 * signalling it); -1 if it cannot be made. */
static int data_fd(NetworkImpl *impl) {
    std::lock_guard<std::mutex> g(impl->mu);
    if (impl->data_fd < 0) {
        int fd = -1;
        if (impl->net && tc_network_fd(impl->net, &fd) == TC_OK) impl->data_fd = fd;
        if (impl->be && tc_backend_fd(impl->be, &fd) == TC_OK) impl->data_fd = fd;
    }
    return impl->data_fd;
}

/* How long a blocking back-end receive waits at a time: a stream closed meanwhile is
 * reported within this (ms). */
static const uint64_t BE_SLICE_MS = 200;

/* Waits up to `ms` for `fd` to be readable. */
static void wait_fd(int fd, int ms) {
    struct pollfd pfd = {fd, POLLIN, 0};
    if (fd < 0) {
        usleep((useconds_t)ms * 1000);
        return;
    }
    poll(&pfd, 1, ms);
}

/* ---- Communicator ---- */

Communicator::Communicator(Network *net, const std::set<Rank> &ranks) : _network(net) {
    for (std::set<Rank>::const_iterator it = ranks.begin(); it != ranks.end(); ++it) add_EndPoint(*it);
}

Communicator::~Communicator() {
    for (std::set<CommunicationNode *>::iterator it = _back_ends.begin(); it != _back_ends.end(); ++it) delete *it;
    if (_network && _network->_impl) {
        std::lock_guard<std::mutex> g(_network->_impl->mu);
        _network->_impl->comms.remove(this);
        if (_network->_impl->bcast == this) _network->_impl->bcast = NULL;
    }
}

bool Communicator::add_EndPoint(Rank irank) {
    if (_ranks.count(irank)) return true;
    std::string host = "localhost";
    if (_network && _network->_impl && _network->_impl->topo) {
        NetworkTopology::Node *n = _network->_impl->topo->find_Node(irank);
        if (n) host = n->get_HostName();
    }
    _ranks.insert(irank);
    _back_ends.insert(new CommunicationNode(host, UnknownPort, irank));
    return true;
}

bool Communicator::add_EndPoint(CommunicationNode *n) { return n ? add_EndPoint(n->get_Rank()) : false; }

/* ---- NetworkTopology ---- */

NetworkTopology::NetworkTopology() : _root(NULL) {}
NetworkTopology::~NetworkTopology(void) { clear(); }

void NetworkTopology::clear(void) {
    std::lock_guard<std::recursive_mutex> g(_mu);
    for (size_t i = 0; i < _nodes.size(); i++) delete _nodes[i];
    _nodes.clear();
    for (std::map<Rank, Node *>::iterator it = _held.begin(); it != _held.end(); ++it) delete it->second;
    _held.clear();
    _root = NULL;
}

unsigned int NetworkTopology::Node::find_SubTreeHeight(void) {
    unsigned int h = 0;
    for (std::set<Node *>::iterator it = _children.begin(); it != _children.end(); ++it)
        h = std::max(h, (*it)->find_SubTreeHeight() + 1);
    return h;
}

/* "host:index" -> host, port-less; the index is the file's. */
static std::string host_of(const std::string &key) {
    size_t colon = key.rfind(':');
    return colon == std::string::npos ? key : key.substr(0, colon);
}

bool NetworkTopology::parse(const std::string &text, bool leaves_are_backends) {
    std::lock_guard<std::recursive_mutex> g(_mu);
    clear();
    _text = text;
    std::map<std::string, std::vector<std::string> > kids;
    std::string first;
    std::string stmt;
    std::istringstream in(text);
    std::string tok;
    std::vector<std::string> words;
    while (in >> tok) {
        if (tok == ";" || (tok.size() > 1 && tok[tok.size() - 1] == ';')) {
            if (tok != ";") words.push_back(tok.substr(0, tok.size() - 1));
            if (!words.empty()) {
                if (first.empty()) first = words[0];
                if (words.size() > 2 && words[1] == "=>")
                    kids[words[0]].assign(words.begin() + 2, words.end());
            }
            words.clear();
        } else {
            words.push_back(tok);
        }
    }
    if (first.empty()) return false;
    /* pre-order walk: ids as treecast numbers nodes, leaves ranked in order */
    Rank next_leaf = 0;
    unsigned int next_id = 0;
    std::vector<std::pair<std::string, Node *> > stack;
    stack.push_back(std::make_pair(first, (Node *)NULL));
    while (!stack.empty()) {
        std::pair<std::string, Node *> top = stack.back();
        stack.pop_back();
        std::map<std::string, std::vector<std::string> >::iterator k = kids.find(top.first);
        bool leaf = k == kids.end() || k->second.empty();
        bool be = leaf && leaves_are_backends && top.second != NULL;
        unsigned int id = next_id++;
        Rank r = be ? next_leaf++ : INTERNAL_RANK_BASE + id;
        Node *n = new Node(host_of(top.first), UnknownPort, r, be);
        n->_parent = top.second;
        if (top.second) top.second->_children.insert(n);
        _nodes.push_back(n);
        if (!_root) _root = n;
        if (!leaf)
            for (size_t i = k->second.size(); i-- > 0;) stack.push_back(std::make_pair(k->second[i], n));
    }
    return true;
}

void NetworkTopology::print_TopologyFile(const char *filename) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    FILE *f = filename ? fopen(filename, "w") : NULL;
    if (!f) return;
    fputs(_text.c_str(), f);
    fclose(f);
}

void NetworkTopology::print_DOTGraph(const char *filename) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    FILE *f = filename ? fopen(filename, "w") : NULL;
    if (!f) return;
    fprintf(f, "digraph tree {\n");
    for (size_t i = 0; i < _nodes.size(); i++)
        for (std::set<Node *>::iterator it = _nodes[i]->_children.begin(); it != _nodes[i]->_children.end(); ++it)
            fprintf(f, "  \"%s:%u\" -> \"%s:%u\";\n", _nodes[i]->_hostname.c_str(), _nodes[i]->_rank,
                    (*it)->_hostname.c_str(), (*it)->_rank);
    fprintf(f, "}\n");
    fclose(f);
}

void NetworkTopology::print(FILE *f) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    fputs(_text.c_str(), f ? f : stdout);
}

unsigned int NetworkTopology::get_NumNodes(void) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    return (unsigned int)_nodes.size();
}

unsigned int NetworkTopology::depth_of(Node *n) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    unsigned int d = 0;
    while (n && n->_parent) {
        n = n->_parent;
        d++;
    }
    return d;
}

void NetworkTopology::get_TreeStatistics(unsigned int &onum_nodes, unsigned int &odepth, unsigned int &omin_fanout,
                                         unsigned &omax_fanout, double &oavg_fanout, double &ostddev_fanout) {
    std::lock_guard<std::recursive_mutex> g(_mu);
    onum_nodes = (unsigned int)_nodes.size();
    odepth = 0;
    omin_fanout = 0;
    omax_fanout = 0;
    std::vector<unsigned int> fans;
    for (size_t i = 0; i < _nodes.size(); i++) {
        odepth = std::max(odepth, depth_of(_nodes[i]));
        if (!_nodes[i]->_children.empty()) fans.push_back((unsigned int)_nodes[i]->_children.size());
    }
    double sum = 0, sq = 0;
    for (size_t i = 0; i < fans.size(); i++) {
        omin_fanout = i == 0 ? fans[i] : std::min(omin_fanout, fans[i]);
        omax_fanout = std::max(omax_fanout, fans[i]);
        sum += fans[i];
    }
    oavg_fanout = fans.empty() ? 0 : sum / fans.size();
    for (size_t i = 0; i < fans.size(); i++) sq += (fans[i] - oavg_fanout) * (fans[i] - oavg_fanout);
    ostddev_fanout = fans.empty() ? 0 : sqrt(sq / fans.size());
}

NetworkTopology::Node *NetworkTopology::find_Node(Rank r) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    for (size_t i = 0; i < _nodes.size(); i++)
        if (_nodes[i]->_rank == r) return _nodes[i];
    return NULL;
}

void NetworkTopology::get_Leaves(std::vector<Node *> &leaves) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    for (size_t i = 0; i < _nodes.size(); i++)
        if (_nodes[i]->_children.empty()) leaves.push_back(_nodes[i]);
}

void NetworkTopology::get_ParentNodes(std::set<Node *> &out) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    for (size_t i = 0; i < _nodes.size(); i++)
        if (!_nodes[i]->_children.empty()) out.insert(_nodes[i]);
}

void NetworkTopology::get_OrphanNodes(std::set<Node *> &) const {}

void NetworkTopology::get_BackEndNodes(std::set<Node *> &out) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    for (size_t i = 0; i < _nodes.size(); i++)
        if (_nodes[i]->_is_backend) out.insert(_nodes[i]);
}

size_t NetworkTopology::num_BackEndNodes(void) const {
    std::set<Node *> s;
    get_BackEndNodes(s);
    return s.size();
}

size_t NetworkTopology::num_InternalNodes(void) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    return _nodes.size() - num_BackEndNodes();
}

void NetworkTopology::get_Descendants(Node *n, std::vector<Node *> &out) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    if (!n) return;
    for (std::set<Node *>::iterator it = n->_children.begin(); it != n->_children.end(); ++it) {
        out.push_back(*it);
        get_Descendants(*it, out);
    }
}

void NetworkTopology::get_LeafDescendants(Node *n, std::vector<Node *> &out) const {
    std::lock_guard<std::recursive_mutex> g(_mu);
    std::vector<Node *> all;
    get_Descendants(n, all);
    for (size_t i = 0; i < all.size(); i++)
        if (all[i]->_children.empty()) out.push_back(all[i]);
}

std::string NetworkTopology::get_TopologyString(void) {
    std::lock_guard<std::recursive_mutex> g(_mu);
    return _text;
}

void NetworkTopology::hold_BackEnds(void) {
    std::lock_guard<std::recursive_mutex> g(_mu);
    std::vector<Node *> kept;
    for (size_t i = 0; i < _nodes.size(); i++) {
        Node *n = _nodes[i];
        if (!n->_is_backend) {
            kept.push_back(n);
            continue;
        }
        if (n->_parent) n->_parent->_children.erase(n);
        _held[n->_rank] = n;
    }
    _nodes.swap(kept);
}

void NetworkTopology::set_ParentPort(Rank held, Port port) {
    std::lock_guard<std::recursive_mutex> g(_mu);
    std::map<Rank, Node *>::iterator it = _held.find(held);
    if (it != _held.end() && it->second->_parent) it->second->_parent->_port = port;
}

bool NetworkTopology::attach_BackEnd(Rank r) {
    std::lock_guard<std::recursive_mutex> g(_mu);
    std::map<Rank, Node *>::iterator it = _held.find(r);
    if (it == _held.end()) return false;
    Node *n = it->second;
    _held.erase(it);
    if (n->_parent) n->_parent->_children.insert(n);
    _nodes.push_back(n);
    return true;
}

/* ---- Network ---- */

/* ---- Networks still alive at exit ---- */

/* How long the exit drain waits for what one network sent to be written (ms). */
static const uint64_t EXIT_DRAIN_MS = 2000;

/* The live networks, so that exit() writes what they sent (a flush does not wait:
 * see Network::flush). Function-local, so that it is made before the handler that
 * reads it is registered and so outlives it. */
static std::mutex &live_mu() {
    static std::mutex mu;
    return mu;
}
static std::set<NetworkImpl *> &live() {
    static std::set<NetworkImpl *> nets;
    return nets;
}

/* The process that registered the drain: a child it forks inherits the handler but
 * not treecast's threads, and must not wait on them. */
static pid_t drain_owner = 0;

/* Writes out what every live network sent: a tool that flushes and then returns
 * from main (or calls exit) without deleting its Network loses nothing. exit() has
 * destroyed the exiting thread's thread-locals (treecast's among them) before it
 * runs this, so a thread of its own does the writing. The set stays locked, so a
 * Network deleted meanwhile on another thread waits for the drain. */
static void drain_at_exit(void) {
    if (getpid() != drain_owner) return;
    try {
        std::thread drain([] {
            std::lock_guard<std::mutex> g(live_mu());
            for (std::set<NetworkImpl *>::iterator it = live().begin(); it != live().end(); ++it) {
                if ((*it)->be) tc_backend_flush((*it)->be, EXIT_DRAIN_MS);
                if ((*it)->net) tc_network_flush((*it)->net, EXIT_DRAIN_MS);
            }
        });
        drain.join();
    } catch (const std::exception &e) {
        fprintf(stderr, "mrnet: cannot write out what was sent before exit: %s\n", e.what());
    }
}

static void add_live(NetworkImpl *impl) {
    static std::once_flag registered;
    live_mu();
    live();
    std::call_once(registered, [] {
        drain_owner = getpid();
        atexit(drain_at_exit);
    });
    std::lock_guard<std::mutex> g(live_mu());
    live().insert(impl);
}

static void remove_live(NetworkImpl *impl) {
    std::lock_guard<std::mutex> g(live_mu());
    live().erase(impl);
}

Network::Network(void) : _impl(new NetworkImpl) { add_live(_impl); }

static void event_loop(Network *net, NetworkImpl *impl);

/* An MRNet setting: CreateNetworkFE's attribute of that name, else the environment
 * variable; empty when neither is set. */
static std::string setting(const std::map<std::string, std::string> *attrs, const char *name) {
    if (attrs) {
        std::map<std::string, std::string>::const_iterator it = attrs->find(name);
        if (it != attrs->end()) return it->second;
    }
    const char *v = getenv(name);
    return v ? v : "";
}

/* MRNET_OUTPUT_LEVEL, as every MRNet process reads it when it joins. */
static void output_level_from_env(void) {
    const char *level = getenv("MRNET_OUTPUT_LEVEL");
    if (level) set_OutputLevel(atoi(level));
}

/* The options both launch modes share: the comm node program (MRNET_COMM_PATH, the
 * attribute, then the prefix's own), time limits, and ssh for other hosts. */
static bool common_options(tc_network_options *o, const char *itopology,
                           const std::map<std::string, std::string> *attrs) {
    std::string comm;
    if (getenv("MRNET_COMM_PATH")) comm = getenv("MRNET_COMM_PATH");
    if (comm.empty() && attrs) {
        std::map<std::string, std::string>::const_iterator it = attrs->find("MRNET_COMMNODE_PATH");
        if (it != attrs->end()) comm = it->second;
    }
    struct stat st;
    std::string own = std::string(MRN_PREFIX) + "/bin/mrnet_commnode";
    if (comm.empty() && *MRN_PREFIX && stat(own.c_str(), &st) == 0) comm = own;
    if (!comm.empty()) tc_network_options_set_treecast_path(o, comm.c_str());
    /* MRNet's sends wait as long as it takes (and need no timer then) */
    tc_network_options_set_send_timeout(o, TC_FOREVER);
    if (getenv("MRNET_STARTUP_TIMEOUT"))
        tc_network_options_set_startup_timeout(o, (uint64_t)atoi(getenv("MRNET_STARTUP_TIMEOUT")) * 1000);
    /* Hosts other than this one: treecast's ssh launcher through MRNet's remote shell,
     * XPLAT_RSH (default ssh) with XPLAT_RSH_ARGS before the host (else
     * TREECAST_SSH_ARGS), and XPLAT_REMCMD run on the remote host before the program;
     * each from CreateNetworkFE's attributes, then the environment. */
    if (!all_hosts_local(itopology)) {
        std::string rsh = setting(attrs, "XPLAT_RSH"), args = setting(attrs, "XPLAT_RSH_ARGS");
        std::string remcmd = setting(attrs, "XPLAT_REMCMD");
        if (args.empty() && getenv("TREECAST_SSH_ARGS")) args = getenv("TREECAST_SSH_ARGS");
        if (tc_network_options_set_ssh(o, rsh.empty() ? NULL : rsh.c_str(), args.c_str(), remcmd.c_str()) != TC_OK)
            return false;
    }
    return true;
}

/* How many back-ends attach-mode tools start: TREECAST_MRNET_BACKENDS (environment or
 * attribute); 0 when not given or not a number. */
static uint32_t attach_count(const std::map<std::string, std::string> *attrs) {
    std::string v;
    if (getenv("TREECAST_MRNET_BACKENDS")) v = getenv("TREECAST_MRNET_BACKENDS");
    if (v.empty() && attrs) {
        std::map<std::string, std::string>::const_iterator it = attrs->find("TREECAST_MRNET_BACKENDS");
        if (it != attrs->end()) v = it->second;
    }
    char *end = NULL;
    unsigned long n = strtoul(v.c_str(), &end, 10);
    if (v.empty() || *end || n == 0 || n > 1000000) return 0;
    return (uint32_t)n;
}

/* Attach mode's tree as an MRNet topology text: the file's nodes, with `n` back-end
 * places under its leaves (in blocks, leaves in pre-order, the first ones taking one
 * more), named on each leaf's host with indices the file does not use. Empty, with
 * `err`, when the file cannot be read or has fewer back-ends than leaves. */
static std::string attach_topology(const char *path, uint32_t n, std::string &err) {
    std::ifstream f(path ? path : "");
    if (!f) {
        err = std::string("cannot read the topology file ") + (path ? path : "(null)");
        return "";
    }
    std::string text, line;
    while (std::getline(f, line)) {
        std::string::size_type hash = line.find('#');
        if (hash != std::string::npos) line.erase(hash);
        text += line + "\n";
    }
    /* statements: `parent => child ... ;` or a lone `node ;` */
    std::map<std::string, std::vector<std::string> > kids;
    std::map<std::string, unsigned long> top_index; /* highest index per host */
    std::string root, out;
    std::string::size_type at = 0;
    while (at < text.size()) {
        std::string::size_type semi = text.find(';', at);
        std::string stmt = text.substr(at, semi == std::string::npos ? std::string::npos : semi - at);
        at = semi == std::string::npos ? text.size() : semi + 1;
        std::istringstream words(stmt);
        std::vector<std::string> w;
        std::string t;
        while (words >> t) w.push_back(t);
        if (w.empty()) continue;
        for (size_t i = 0; i < w.size(); i++) {
            if (w[i] == "=>") continue;
            std::string::size_type colon = w[i].rfind(':');
            if (colon == std::string::npos) continue;
            unsigned long idx = strtoul(w[i].c_str() + colon + 1, NULL, 10);
            std::string host = w[i].substr(0, colon);
            if (!top_index.count(host) || top_index[host] < idx) top_index[host] = idx;
        }
        if (root.empty()) root = w[0];
        if (w.size() > 2 && w[1] == "=>") {
            kids[w[0]].insert(kids[w[0]].end(), w.begin() + 2, w.end());
            out += stmt + " ;\n";
        }
    }
    if (root.empty()) {
        err = std::string("the topology file ") + path + " names no node";
        return "";
    }
    std::vector<std::string> leaves, stack(1, root);
    while (!stack.empty()) {
        std::string node = stack.back();
        stack.pop_back();
        std::map<std::string, std::vector<std::string> >::iterator k = kids.find(node);
        if (k == kids.end() || k->second.empty()) {
            leaves.push_back(node);
            continue;
        }
        for (size_t i = k->second.size(); i-- > 0;) stack.push_back(k->second[i]);
    }
    if (n < leaves.size()) {
        std::ostringstream m;
        m << "TREECAST_MRNET_BACKENDS is " << n << " but the topology has " << leaves.size()
          << " leaves: attach mode needs at least one back-end under each";
        err = m.str();
        return "";
    }
    for (size_t i = 0; i < leaves.size(); i++) {
        size_t count = n / leaves.size() + (i < n % leaves.size() ? 1 : 0);
        std::string host = host_of(leaves[i]);
        out += leaves[i] + " =>";
        for (size_t k = 0; k < count; k++) {
            std::ostringstream name;
            name << " " << host << ":" << ++top_index[host];
            out += name.str();
        }
        out += " ;\n";
    }
    return out;
}

/* Attach mode: the port of each back-end's place, from the attach file treecast wrote
 * (this user's, mode 0600): `rank R NODE HOST:PORT` lines. */
static std::vector<std::pair<Rank, Port> > attach_ports(const std::string &file) {
    std::vector<std::pair<Rank, Port> > out;
    std::ifstream f(file.c_str());
    std::string line;
    while (std::getline(f, line)) {
        std::istringstream words(line);
        std::string kw, addr;
        unsigned long rank = 0, node = 0;
        if (!(words >> kw) || kw != "rank" || !(words >> rank >> node >> addr)) continue;
        std::string::size_type colon = addr.rfind(':');
        if (colon == std::string::npos || addr.compare(0, 5, "unix:") == 0) continue;
        out.push_back(std::make_pair((Rank)rank, (Port)strtoul(addr.c_str() + colon + 1, NULL, 10)));
    }
    return out;
}

static void start_events(Network *n, NetworkImpl *impl);
static void deliver(Network *net, NetworkImpl *impl, EventClass cls, EventType typ, EventData *data);

/* Attach mode: runs treecast's launch until every back-end attached; then they join
 * the topology and the broadcast communicator, and the tool hears of each
 * (TOPOL_ADD_BE). A failed launch is an ERROR_SYSTEM event and ends the network. */
static void attach_launch(Network *n, NetworkImpl *impl, tc_network_options *o) {
    tc_network *net = NULL;
    tc_result r = tc_network_launch(o, &net);
    tc_network_options_free(o);
    if (r != TC_OK) {
        const char *why = tc_last_error();
        std::string msg = std::string("the back-ends did not all attach: ") + (why && *why ? why : "no reason given");
        if (CUR_OUTPUT_LEVEL >= 1) fprintf(stderr, "mrnet: %s\n", msg.c_str());
        {
            std::lock_guard<std::mutex> g(impl->mu);
            impl->attach = ATTACH_FAILED;
            impl->attach_error = msg;
            impl->shutdown = true;
        }
        impl->attached.notify_all();
        deliver(n, impl, Event::ERROR_EVENT, ErrorEvent::ERROR_SYSTEM, new ErrorEvent::ErrorEventData(UnknownRank, msg));
        return;
    }
    std::vector<std::pair<Rank, Rank> > joined; /* rank, parent rank */
    {
        std::lock_guard<std::mutex> g(impl->mu);
        impl->net = net;
        for (Rank i = 0; i < tc_network_backends(net); i++) {
            if (!impl->topo->attach_BackEnd(i)) continue;
            NetworkTopology::Node *be = impl->topo->find_Node(i);
            joined.push_back(std::make_pair(i, be ? be->get_Parent() : UnknownRank));
            if (impl->bcast) impl->bcast->add_EndPoint(i);
        }
        impl->attach = ATTACH_DONE;
        if (impl->events_wanted) start_events(n, impl);
    }
    impl->attached.notify_all();
    for (size_t i = 0; i < joined.size(); i++)
        deliver(n, impl, Event::TOPOLOGY_EVENT, TopologyEvent::TOPOL_ADD_BE,
                new TopologyEvent::TopolEventData(joined[i].first, joined[i].second));
}

Network *Network::CreateNetworkFE(const char *itopology, const char *ibackend_exe, const char **ibackend_argv,
                                  const std::map<std::string, std::string> *attrs, bool, bool) {
    Network *n = new Network();
    NetworkImpl *impl = n->_impl;
    impl->fe = true;
    impl->host = local_host_name();
    impl->rank = INTERNAL_RANK_BASE;
    output_level_from_env();
    if (!ibackend_exe || !*ibackend_exe) {
        n->create_attached(itopology, attrs);
        return n;
    }
    tc_network_options *o = tc_network_options_new();
    if (tc_network_options_set_topology_file(o, itopology) != TC_OK) {
        fail(n, ERR_TOPOLOGY_FORMAT, "reading the topology file");
        tc_network_options_free(o);
        return n;
    }
    std::vector<const char *> argv;
    argv.push_back(ibackend_exe);
    for (const char **a = ibackend_argv; a && *a; a++) argv.push_back(*a);
    /* MRNet starts back-ends with five more arguments (parent host, port and rank, own
     * host and rank), and some check for them: the comm node that starts each one
     * puts them in place of this argument. */
    argv.push_back("{treecast:mrnet-backend-args}");
    tc_network_options_set_backend(o, &argv[0], argv.size());
    if (!common_options(o, itopology, attrs)) {
        fail(n, ERR_SYSTEM, "the remote shell settings (XPLAT_RSH, XPLAT_RSH_ARGS, XPLAT_REMCMD)");
        tc_network_options_free(o);
        return n;
    }
    tc_network *net = NULL;
    tc_result r = tc_network_launch(o, &net);
    tc_network_options_free(o);
    if (r != TC_OK) {
        fail(n, ERR_NETWORK_FAILURE, "launching the network");
        return n;
    }
    impl->net = net;
    impl->topo = new NetworkTopology();
    char *text = NULL;
    if (tc_network_topology(net, &text) == TC_OK) {
        impl->topo->parse(text, true);
        tc_string_free(text);
    }
    std::set<Rank> all;
    for (Rank i = 0; i < tc_network_backends(net); i++) all.insert(i);
    impl->bcast = new Communicator(n, all);
    impl->comms.push_back(impl->bcast);
    return n;
}

/* Attach mode (no back-end program): launches the comm nodes of the file's tree with
 * TREECAST_MRNET_BACKENDS places under its leaves, waits until they listen, gives the
 * leaves their ports and exports the attach file's path (TREECAST_ATTACH) so that the
 * back-ends the tool starts inherit it; the launch goes on in a thread until every
 * back-end attached. */
bool Network::create_attached(const char *itopology, const std::map<std::string, std::string> *attrs) {
    NetworkImpl *impl = _impl;
    uint32_t count = attach_count(attrs);
    if (count == 0) {
        error(ERR_INTERNAL, UnknownRank,
              "attach mode (no back-end program): treecast needs the number of back-ends the tool will start, "
              "in TREECAST_MRNET_BACKENDS (docs/mrnet-compat.md)");
        return false;
    }
    std::string err;
    std::string text = attach_topology(itopology, count, err);
    if (text.empty()) {
        error(ERR_TOPOLOGY_FORMAT, UnknownRank, "attach mode: %s", err.c_str());
        return false;
    }
    char dir[] = "/tmp/mrnet-attach-XXXXXX";
    if (!mkdtemp(dir)) {
        error(ERR_SYSTEM, UnknownRank, "attach mode: making a private folder in /tmp: %s", strerror(errno));
        return false;
    }
    impl->attach_dir = dir;
    std::string topo_file = impl->attach_dir + "/topology", file = impl->attach_dir + "/attach";
    {
        std::ofstream t(topo_file.c_str());
        t << text;
        if (!t) {
            error(ERR_SYSTEM, UnknownRank, "attach mode: writing %s", topo_file.c_str());
            return false;
        }
    }
    tc_network_options *o = tc_network_options_new();
    if (tc_network_options_set_topology_file(o, topo_file.c_str()) != TC_OK) {
        fail(this, ERR_TOPOLOGY_FORMAT, "reading the topology file");
        tc_network_options_free(o);
        return false;
    }
    if (!common_options(o, itopology, attrs)) {
        fail(this, ERR_SYSTEM, "the remote shell settings (XPLAT_RSH, XPLAT_RSH_ARGS, XPLAT_REMCMD)");
        tc_network_options_free(o);
        return false;
    }
    /* the leaves' own hosts: each listens on its loopback address with a port that a
     * back-end there is given (get_Leaves), not on a Unix socket */
    tc_network_options_set_route(o, "tcp");
    impl->attach_ms = 300000;
    if (getenv("MRNET_STARTUP_TIMEOUT")) impl->attach_ms = (uint64_t)atoi(getenv("MRNET_STARTUP_TIMEOUT")) * 1000;
    tc_network_options_set_attach(o, file.c_str(), impl->attach_ms);
    impl->topo = new NetworkTopology();
    impl->topo->parse(text, true);
    impl->topo->hold_BackEnds();
    impl->bcast = new Communicator(this, std::set<Rank>());
    impl->comms.push_back(impl->bcast);
    impl->attach = ATTACH_WAITING;
    impl->attach_backends = count;
    /* Exported before the launch starts threads that could read the environment while
     * it changes (setenv is not safe then); it stays set after the network ends. */
    setenv("TREECAST_ATTACH", file.c_str(), 1);
    impl->launching = std::thread(attach_launch, this, impl, o);
    /* the file is written once every comm node listens */
    struct stat st;
    for (uint64_t waited = 0; stat(file.c_str(), &st) != 0; waited += 20) {
        std::string why;
        {
            std::lock_guard<std::mutex> g(impl->mu);
            if (impl->attach == ATTACH_FAILED) why = impl->attach_error;
        }
        if (why.empty() && waited > impl->attach_ms) why = "the comm nodes did not start in time";
        if (!why.empty()) {
            error(ERR_NETWORK_FAILURE, UnknownRank, "attach mode: %s", why.c_str());
            return false;
        }
        usleep(20000);
    }
    std::vector<std::pair<Rank, Port> > ports = attach_ports(file);
    if (ports.size() != count) {
        error(ERR_NETWORK_FAILURE, UnknownRank, "attach mode: the attach file %s names %u places, not %u",
              file.c_str(), (unsigned)ports.size(), count);
        return false;
    }
    for (size_t i = 0; i < ports.size(); i++) impl->topo->set_ParentPort(ports[i].first, ports[i].second);
    return true;
}

/* Starts the thread that reads treecast's events, once, when the tool first wants
 * events (a callback, a descriptor, the queue): until then they wait in treecast's
 * queue, and a tool that wants none pays nothing for them. */
static void want_events(Network *n, NetworkImpl *impl) {
    std::lock_guard<std::mutex> g(impl->mu);
    impl->events_wanted = true;
    start_events(n, impl);
}

/* Starts the event thread if there is a network and none runs; under impl->mu. */
static void start_events(Network *n, NetworkImpl *impl) {
    if (impl->net && !impl->events.joinable() && !impl->stop) impl->events = std::thread(event_loop, n, impl);
}

/* Attach mode: whether the back-ends are still attaching. */
static bool attaching(NetworkImpl *impl) {
    std::lock_guard<std::mutex> g(impl->mu);
    return impl->attach == ATTACH_WAITING;
}

Network *Network::CreateNetworkBE(int argc, char *argv[]) {
    Network *n = new Network();
    NetworkImpl *impl = n->_impl;
    impl->fe = false;
    impl->host = local_host_name();
    output_level_from_env();
    tc_result r;
    if (getenv("TREECAST_PARENT")) {
        r = tc_backend_connect(&impl->be);
    } else if (argc >= 6) {
        /* MRNet's convention: ... parent host, parent port, parent rank, own host,
         * own rank. The parent's address and the secret come from the attach file
         * (TREECAST_ATTACH): never from the command line. */
        char *end = NULL;
        long rank = strtol(argv[argc - 1], &end, 10);
        const char *file = getenv("TREECAST_ATTACH");
        if (!*argv[argc - 1] || *end || rank < 0) {
            n->error(ERR_INTERNAL, UnknownRank, "the own-rank argument \"%s\" is not a rank (0, 1, ...)",
                     argv[argc - 1]);
            return n;
        }
        if (!file || !*file) {
            n->error(ERR_INTERNAL, UnknownRank,
                     "this back-end has MRNet's arguments but no TREECAST_ATTACH in its environment: the front-end "
                     "exports it; whatever started this back-end must pass it on (docs/mrnet-compat.md)");
            return n;
        }
        /* the place of this rank is in the file; a parent port given otherwise is
         * only noted (the tool paired ranks with leaves otherwise than in blocks) */
        std::vector<std::pair<Rank, Port> > ports = attach_ports(file);
        Port given = (Port)strtoul(argv[argc - 4], NULL, 10);
        for (size_t i = 0; i < ports.size(); i++)
            if (ports[i].first == (Rank)rank && ports[i].second != given && CUR_OUTPUT_LEVEL >= 1)
                fprintf(stderr, "mrnet: rank %ld joins under the leaf at port %u, its rank's place, not %s\n", rank,
                        (unsigned)ports[i].second, argv[argc - 4]);
        r = tc_backend_attach(NULL, rank, &impl->be);
    } else {
        n->error(ERR_INTERNAL, UnknownRank,
                 "this back-end was not started by treecast (no TREECAST_PARENT) and has no MRNet-style "
                 "arguments (parent host, port, rank, own host, rank)");
        return n;
    }
    if (r != TC_OK) {
        fail(n, ERR_NETWORK_FAILURE, "joining the network as a back-end");
        impl->be = NULL;
        return n;
    }
    impl->rank = tc_backend_rank(impl->be);
    /* MRNet's sends wait as long as it takes */
    tc_backend_set_send_timeout(impl->be, TC_FOREVER);
    impl->topo = new NetworkTopology();
    return n;
}

Network *Network::CreateNetworkIN(int, char *[]) {
    Network *n = new Network();
    NetworkImpl *impl = n->_impl;
    impl->internal = true;
    impl->host = local_host_name();
    output_level_from_env();
    /* treecast starts the comm node program (MRNET_COMM_PATH) as `PROGRAM node`, with
     * the parent's address and the secret in its environment; the arguments MRNet's
     * own main strips or passes on play no part. */
    if (!tc_started_as_comm_node()) {
        n->error(ERR_INTERNAL, UnknownRank,
                 "CreateNetworkIN: this process was not started by treecast as a comm node (treecast runs the "
                 "program MRNET_COMM_PATH names as `PROGRAM node`, its parent's address in the environment)");
        return n;
    }
    impl->comm_node = std::thread([n, impl] {
        /* prints why on failure (the parent reports the node lost); the tool's main
         * sees has_Error once waitfor_ShutDown returns */
        if (tc_run_comm_node() != 0)
            n->error(ERR_NETWORK_FAILURE, UnknownRank, "the comm node ended on an error (printed above)");
        impl->shutdown = true;
    });
    return n;
}

Network::~Network() {
    NetworkImpl *impl = _impl;
    /* a comm node lives until the tree ends, whether or not the tool waited for it */
    if (impl->comm_node.joinable()) impl->comm_node.join();
    remove_live(impl);
    {
        std::lock_guard<std::mutex> g(impl->mu);
        impl->stop = true;
    }
    impl->attached.notify_all();
    /* attach mode: the launch ends when the last back-end attached or at its limit */
    if (impl->launching.joinable()) impl->launching.join();
    if (impl->events.joinable()) impl->events.join();
    std::vector<Stream *> streams;
    {
        std::lock_guard<std::mutex> g(impl->mu);
        if (impl->fe) {
            streams.assign(impl->all_streams.begin(), impl->all_streams.end());
            for (std::map<Rank, Stream *>::iterator it = impl->privates.begin(); it != impl->privates.end(); ++it)
                streams.push_back(it->second);
        } else
            for (std::map<unsigned int, Stream *>::iterator it = impl->streams.begin(); it != impl->streams.end(); ++it)
                streams.push_back(it->second);
    }
    for (size_t i = 0; i < streams.size(); i++) delete streams[i];
    std::vector<Communicator *> comms(impl->comms.begin(), impl->comms.end());
    for (size_t i = 0; i < comms.size(); i++) delete comms[i];
    if (impl->net) tc_network_free(impl->net);
    if (impl->be) {
        if (impl->shutdown)
            tc_backend_free(impl->be);
        else
            tc_backend_close(impl->be);
    }
    for (std::map<EventClass, int[2]>::iterator it = impl->pipes.begin(); it != impl->pipes.end(); ++it) {
        close(it->second[0]);
        close(it->second[1]);
    }
    for (std::list<Event *>::iterator it = impl->queue.begin(); it != impl->queue.end(); ++it) {
        delete (*it)->get_Data();
        delete *it;
    }
    delete impl->topo;
    if (impl->private_fd >= 0) close(impl->private_fd);
    if (impl->parked_fd >= 0) close(impl->parked_fd);
    if (!impl->attach_dir.empty()) {
        std::string file = impl->attach_dir + "/attach";
        unlink(file.c_str());
        unlink((impl->attach_dir + "/topology").c_str());
        rmdir(impl->attach_dir.c_str());
    }
    _impl = NULL;
    delete impl;
}

NetworkTopology *Network::get_NetworkTopology(void) const { return _impl->topo; }
bool Network::is_ShutDown(void) const { return _impl->shutdown; }

void Network::waitfor_ShutDown(void) const {
    NetworkImpl *impl = _impl;
    while (!impl->shutdown) {
        if (impl->be) {
            tc_packet *p = NULL;
            tc_result r = tc_backend_recv(impl->be, SLICE_MS, &p);
            if (r == TC_OK) {
                /* a packet nobody will read now: keep it for its stream */
                PacketPtr pk = from_tc(p);
                tc_packet_free(p);
                std::lock_guard<std::mutex> g(impl->mu);
                std::map<unsigned int, Stream *>::iterator it = impl->streams.find(pk->get_StreamId());
                if (it != impl->streams.end()) it->second->_pending.push_back(pk);
            } else if (r != TC_ERR_TIMEOUT && r != TC_ERR_AGAIN) {
                impl->shutdown = true;
            }
        } else if (impl->net || attaching(impl)) {
            want_events(const_cast<Network *>(this), impl);
            usleep(SLICE_MS * 1000);
        } else if (impl->comm_node.joinable()) {
            usleep(SLICE_MS * 1000);
        } else {
            return;
        }
    }
}

void Network::print_error(const char *s) { perror(s); }
std::string Network::get_LocalHostName(void) const { return _impl->host; }
Port Network::get_LocalPort(void) const { return UnknownPort; }
Rank Network::get_LocalRank(void) const { return _impl->rank; }
bool Network::is_LocalNodeChild(void) const { return !_impl->fe; }
bool Network::is_LocalNodeParent(void) const { return _impl->fe || _impl->internal; }
bool Network::is_LocalNodeInternal(void) const { return _impl->internal; }
bool Network::is_LocalNodeFrontEnd(void) const { return _impl->fe; }
bool Network::is_LocalNodeBackEnd(void) const { return !_impl->fe && !_impl->internal; }
Communicator *Network::get_BroadcastCommunicator(void) const { return _impl->bcast; }

Communicator *Network::new_Communicator(void) {
    Communicator *c = new Communicator(this, std::set<Rank>());
    std::lock_guard<std::mutex> g(_impl->mu);
    _impl->comms.push_back(c);
    return c;
}

Communicator *Network::new_Communicator(Communicator &o) { return new_Communicator(o._ranks); }

Communicator *Network::new_Communicator(const std::set<Rank> &ranks) {
    Communicator *c = new Communicator(this, ranks);
    std::lock_guard<std::mutex> g(_impl->mu);
    _impl->comms.push_back(c);
    return c;
}

Communicator *Network::new_Communicator(std::set<CommunicationNode *> &nodes) {
    std::set<Rank> ranks;
    for (std::set<CommunicationNode *>::iterator it = nodes.begin(); it != nodes.end(); ++it)
        ranks.insert((*it)->get_Rank());
    return new_Communicator(ranks);
}

CommunicationNode *Network::get_EndPoint(Rank r) const {
    if (!_impl->bcast) return NULL;
    const std::set<CommunicationNode *> &eps = _impl->bcast->get_EndPoints();
    for (std::set<CommunicationNode *>::const_iterator it = eps.begin(); it != eps.end(); ++it)
        if ((*it)->get_Rank() == r) return *it;
    return NULL;
}

/* The adapter plug-in's bytes, built into this library (src/adapter_blob.S). */
extern "C" const unsigned char mrn_adapter_start[];
extern "C" const unsigned char mrn_adapter_end[];

/* Loads the adapter plug-in into the network (once): its bytes go to a memory file
 * that treecast loads and ships down the tree. */
static bool load_adapter(Network *n, NetworkImpl *impl) {
    /* a tool thread loading a filter and one making a stream must not both load it */
    static std::mutex loading;
    std::lock_guard<std::mutex> one(loading);
    if (impl->adapter_loaded) return true;
    size_t len = (size_t)(mrn_adapter_end - mrn_adapter_start);
    char path[64];
    snprintf(path, sizeof path, "/tmp/mrnet-filter-adapter-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) {
        n->error(ERR_SYSTEM, UnknownRank, "writing the filter adapter to a temporary file: %s", strerror(errno));
        return false;
    }
    ssize_t w = write(fd, mrn_adapter_start, len);
    close(fd);
    if (w != (ssize_t)len) {
        unlink(path);
        n->error(ERR_SYSTEM, UnknownRank, "writing the filter adapter to %s: short write", path);
        return false;
    }
    tc_result r = tc_network_load_filter(impl->net, path);
    unlink(path);
    if (r != TC_OK) {
        fail(n, ERR_INTERNAL, "loading the MRNet filter adapter into the tree");
        return false;
    }
    impl->adapter_loaded = true;
    return true;
}

int Network::load_FilterFunc(const char *so_file, const char *func) {
    if (!_impl->fe || (!_impl->net && !attaching(_impl)) || !so_file || !func) {
        error(ERR_INTERNAL, UnknownRank, "load_FilterFunc: only at a running front-end, with a file and a name");
        return -1;
    }
    std::ifstream f(so_file, std::ios::binary);
    if (!f) {
        error(ERR_SYSTEM, UnknownRank, "load_FilterFunc: cannot read %s: %s", so_file, strerror(errno));
        return -1;
    }
    LoadedFilter lf;
    lf.func = func;
    lf.bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    /* FNV-1a of the bytes names the object at every node (each loads it once). */
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < lf.bytes.size(); i++) h = (h ^ lf.bytes[i]) * 1099511628211ULL;
    char id[32];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)h);
    lf.identity = id;
    /* Check here, where the tool can be told, that the object has the function (as
     * MRNet's front-end does). An object this process cannot load at all (a static
     * front-end without -rdynamic leaves its packet code unresolved) is left to the
     * nodes, which report it when a stream uses it. */
    std::string path = strchr(so_file, '/') ? so_file : std::string("./") + so_file; /* the file read above */
    void *obj = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (obj) {
        bool has = dlsym(obj, func) != NULL;
        dlclose(obj);
        if (!has) {
            error(ERR_SYSTEM, UnknownRank, "load_FilterFunc: %s has no function %s (declare it extern \"C\")",
                  so_file, func);
            return -1;
        }
    }
    /* attach mode: the adapter goes into the tree with the first stream using it */
    if (_impl->net && !load_adapter(this, _impl)) return -1;
    std::lock_guard<std::mutex> g(_impl->mu);
    _impl->filters.push_back(lf);
    return FIRST_LOADED_FILTER + (int)_impl->filters.size() - 1;
}

int Network::load_FilterFuncs(const char *so_file, const std::vector<const char *> &functions,
                              std::vector<int> &filter_ids) {
    int ok = 0;
    for (size_t i = 0; i < functions.size(); i++) {
        int id = load_FilterFunc(so_file, functions[i]);
        filter_ids.push_back(id);
        if (id >= 0) ok++;
    }
    return ok;
}

Stream *Network::new_Stream(Communicator *comm, int us, int sync, int ds) {
    if (!_impl->fe || (!_impl->net && !attaching(_impl)) || !comm) {
        error(ERR_INTERNAL, UnknownRank, "new_Stream: only at a running front-end, over a communicator");
        return NULL;
    }
    std::lock_guard<std::mutex> g(_impl->mu);
    Stream *s = new Stream(this, INVALID_STREAM_ID, comm->_ranks, us, sync, ds);
    /* attach mode: the broadcast communicator grows until every back-end attached;
     * the stream takes its ranks when it is made */
    s->_broadcast = comm == _impl->bcast;
    _impl->all_streams.push_back(s);
    return s;
}

/* A stream by id; at the front-end, a back-end's rank gives its private stream, as
 * in MRNet (what Network::send(rank, ...) sent it and what it answered on it). */
Stream *Network::get_Stream(unsigned int iid) const {
    {
        std::lock_guard<std::mutex> g(_impl->mu);
        std::map<unsigned int, Stream *>::const_iterator it = _impl->streams.find(iid);
        /* the point-to-point stream is the layer's own: its packets are the private streams' */
        if (it != _impl->streams.end()) return it->second == _impl->p2p ? NULL : it->second;
        if (!_impl->fe || iid >= STREAM_ID_BASE || !_impl->bcast || !_impl->bcast->_ranks.count(iid)) return NULL;
    }
    return fe_private(const_cast<Network *>(this), _impl, iid);
}

Stream *p2p_stream(Network *n, NetworkImpl *impl) {
    Stream *p2p = NULL;
    {
        /* one stream for every thread's point-to-point sends: made once */
        std::lock_guard<std::mutex> making(impl->p2p_mu);
        {
            std::lock_guard<std::mutex> g(impl->mu);
            p2p = impl->p2p;
        }
        if (!p2p) {
            p2p = n->new_Stream(impl->bcast, TFILTER_NULL, SFILTER_DONTWAIT, TFILTER_NULL);
            if (!p2p) return NULL;
            std::lock_guard<std::mutex> g(impl->mu);
            impl->p2p = p2p;
        }
    }
    return p2p->ensure() ? p2p : NULL;
}

/* The front-end's private streams' bookkeeping (a friend of Stream). */
struct PrivateStreams {
    static Stream *make_locked(Network *n, NetworkImpl *impl, Rank rank);
    static void park(Network *n, NetworkImpl *impl, PacketPtr &p);
    static void clear_fd(NetworkImpl *impl, Stream *p2p);
    static bool any_parked(NetworkImpl *impl);
    static int fd(NetworkImpl *impl, Stream *p2p);
    static void taken_locked(NetworkImpl *impl);
    static struct tc_stream *made(NetworkImpl *impl, Stream *p2p);
};

/* The point-to-point stream's treecast stream once made (NULL before): read under
 * make_mu, which its making holds. */
struct tc_stream *PrivateStreams::made(NetworkImpl *impl, Stream *p2p) {
    if (!p2p) return NULL;
    std::lock_guard<std::mutex> making(impl->make_mu);
    return p2p->_tc;
}

/* Whether a private stream holds a packet; under impl->mu. */
bool PrivateStreams::any_parked(NetworkImpl *impl) {
    for (std::map<Rank, Stream *>::iterator it = impl->privates.begin(); it != impl->privates.end(); ++it)
        if (!it->second->_pending.empty()) return true;
    return false;
}

static void signal_fd(int fd) {
    uint64_t one = 1;
    if (fd >= 0 && write(fd, &one, sizeof one) < 0) { /* full: already readable */
    }
}

static void drain_fd(int fd) {
    uint64_t n;
    if (fd >= 0 && read(fd, &n, sizeof n) < 0) { /* nothing to clear */
    }
}

/* The private streams' descriptor: readable while treecast holds a point-to-point
 * packet or a private stream holds one taken from it. -1 on failure. */
int PrivateStreams::fd(NetworkImpl *impl, Stream *p2p) {
    int tc_fd = -1;
    if (tc_stream_fd(p2p->_tc, &tc_fd) != TC_OK) return -1;
    std::lock_guard<std::mutex> g(impl->mu);
    if (impl->private_fd >= 0) return impl->private_fd;
    int parked = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.events = b.events = EPOLLIN;
    a.data.fd = tc_fd;
    b.data.fd = parked;
    if (parked < 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, tc_fd, &a) != 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, parked, &b) != 0) {
        if (parked >= 0) close(parked);
        if (ep >= 0) close(ep);
        return -1;
    }
    impl->parked_fd = parked;
    impl->private_fd = ep;
    if (any_parked(impl)) signal_fd(parked);
    return ep;
}

/* fe_private's work, under impl->mu. */
Stream *PrivateStreams::make_locked(Network *n, NetworkImpl *impl, Rank rank) {
    std::map<Rank, Stream *>::iterator it = impl->privates.find(rank);
    if (it != impl->privates.end()) return it->second;
    std::set<Rank> one;
    one.insert(rank);
    Stream *s = new Stream(n, rank, one, TFILTER_NULL, SFILTER_DONTWAIT, TFILTER_NULL);
    s->_private = true;
    impl->privates[rank] = s;
    return s;
}

Stream *fe_private(Network *n, NetworkImpl *impl, Rank rank) {
    std::lock_guard<std::mutex> g(impl->mu);
    return PrivateStreams::make_locked(n, impl, rank);
}

/* Front-end: queues a point-to-point packet on its sender's private stream, found
 * and filled under one lock (a tool thread may delete a private stream meanwhile). */
void PrivateStreams::park(Network *n, NetworkImpl *impl, PacketPtr &p) {
    p->set_StreamId(p->get_SourceRank());
    std::lock_guard<std::mutex> g(impl->mu);
    make_locked(n, impl, p->get_SourceRank())->_pending.push_back(p);
    signal_fd(impl->parked_fd);
}

/* Front-end: clears the point-to-point stream's descriptor unless a private stream
 * still holds a packet taken from it (the descriptor every private stream hands out
 * stays readable while any back-end's answer waits). */
/* After a parked packet was taken (under impl->mu): the layer's half of the
 * descriptor is cleared once none is left (treecast's half stays as treecast keeps it). */
void PrivateStreams::taken_locked(NetworkImpl *impl) {
    if (!any_parked(impl)) drain_fd(impl->parked_fd);
}

void PrivateStreams::clear_fd(NetworkImpl *impl, Stream *p2p) {
    std::lock_guard<std::mutex> g(impl->mu);
    if (any_parked(impl)) return;
    drain_fd(impl->parked_fd);
    tc_stream_fd_clear(p2p->_tc);
}

/* Front-end: the private stream a packet from the point-to-point stream belongs to
 * (its sender's); the packet takes that stream's id, the rank, as in MRNet. */
static Stream *private_of(Network *n, NetworkImpl *impl, PacketPtr &p) {
    p->set_StreamId(p->get_SourceRank());
    return fe_private(n, impl, p->get_SourceRank());
}

/* Back-end: the Stream of `id`, made when first seen. */
Stream *be_stream(Network *n, NetworkImpl *impl, unsigned int id);

/* Back-end: takes what arrived without waiting: closed streams and one packet.
 * 1: a packet (in `out`); 0: nothing; 2: a stream closed (`closed`); -1: the end. */
int be_poll(Network *n, NetworkImpl *impl, PacketPtr &out, unsigned int &closed, uint64_t wait_ms) {
    if (impl->data_fd >= 0) tc_backend_fd_clear(impl->be);
    uint32_t id;
    {
        std::lock_guard<std::mutex> g(impl->mu);
        if (!impl->closed_later.empty()) {
            closed = impl->closed_later.front();
            impl->closed_later.pop_front();
            return 2;
        }
    }
    if (tc_backend_next_closed(impl->be, &id) == TC_OK) {
        closed = compat::mrn_stream_id(id);
        return 2;
    }
    tc_packet *p = NULL;
    tc_result r = tc_backend_recv(impl->be, wait_ms, &p);
    if (r == TC_OK) {
        out = from_tc(p);
        tc_packet_free(p);
        if (wait_ms && tc_backend_next_closed(impl->be, &id) == TC_OK) {
            unsigned int closing = compat::mrn_stream_id(id);
            /* the closing of this packet's own stream came after it (the front-end
             * sends nothing on a stream it closed): the packet goes first */
            if (closing == out->get_StreamId()) {
                std::lock_guard<std::mutex> g(impl->mu);
                impl->closed_later.push_back(closing);
                return 1;
            }
            /* another stream's closing that came while waiting came before this
             * packet: it goes first */
            Stream *s = be_stream(n, impl, out->get_StreamId());
            std::lock_guard<std::mutex> g(impl->mu);
            s->_pending.push_back(out);
            out.reset();
            closed = closing;
            return 2;
        }
        return 1;
    }
    if (r == TC_ERR_AGAIN || r == TC_ERR_TIMEOUT) return 0;
    impl->shutdown = true;
    return -1;
}

int Network::recv(int *otag, PacketPtr &opacket, Stream **ostream, bool iblocking) {
    NetworkImpl *impl = _impl;
    if (impl->fe && !impl->net) {
        /* attach mode: nothing can arrive before the back-ends attached */
        if (!attaching(impl)) return -1;
        if (!iblocking) return 0;
        if (!wait_attached(impl)) return -1;
    }
    if (!impl->net && !impl->be) return -1;
    for (;;) {
        if (impl->be) {
            {
                std::lock_guard<std::mutex> g(impl->mu);
                for (std::map<unsigned int, Stream *>::iterator it = impl->streams.begin(); it != impl->streams.end();
                     ++it) {
                    if (!it->second->_pending.empty()) {
                        opacket = it->second->_pending.front();
                        it->second->_pending.pop_front();
                        if (otag) *otag = opacket->get_Tag();
                        if (ostream) *ostream = it->second;
                        return 1;
                    }
                }
            }
            PacketPtr p;
            unsigned int closed = 0;
            int got = be_poll(this, impl, p, closed, iblocking ? BE_SLICE_MS : 0);
            if (got == 1) {
                opacket = p;
                if (otag) *otag = p->get_Tag();
                if (ostream) *ostream = be_stream(this, impl, p->get_StreamId());
                return 1;
            }
            if (got == 2) {
                Stream *s = be_stream(this, impl, closed);
                s->_closed = true;
                if (ostream) *ostream = s;
                return 0;
            }
            if (got < 0) return -1;
            if (!iblocking) return 0;
            continue;
        } else {
            if (data_fd(impl) >= 0) tc_network_fd_clear(impl->net);
            std::vector<Stream *> live;
            Stream *p2p = NULL;
            {
                std::lock_guard<std::mutex> g(impl->mu);
                /* a private stream's packets taken by a receive for another one */
                for (std::map<Rank, Stream *>::iterator it = impl->privates.begin(); it != impl->privates.end(); ++it) {
                    if (!it->second->_pending.empty()) {
                        opacket = it->second->_pending.front();
                        it->second->_pending.pop_front();
                        PrivateStreams::taken_locked(impl);
                        if (otag) *otag = opacket->get_Tag();
                        if (ostream) *ostream = it->second;
                        return 1;
                    }
                }
                p2p = impl->p2p;
                for (std::map<unsigned int, Stream *>::iterator it = impl->streams.begin(); it != impl->streams.end();
                     ++it)
                    if (!it->second->_closed) live.push_back(it->second);
            }
            size_t first = impl->next_stream.load();
            for (size_t k = 0; k < live.size(); k++) {
                Stream *s = live[(first + k) % live.size()];
                tc_packet *p = NULL;
                tc_result r = tc_stream_recv(s->_tc, 0, &p);
                if (r == TC_OK) {
                    /* readable only while packets are queued */
                    if (s == p2p)
                        PrivateStreams::clear_fd(impl, s);
                    else
                        tc_stream_fd_clear(s->_tc);
                    impl->next_stream.store((first + k + 1) % live.size());
                    opacket = from_tc(p);
                    tc_packet_free(p);
                    if (s == p2p) s = private_of(this, impl, opacket);
                    if (otag) *otag = opacket->get_Tag();
                    if (ostream) *ostream = s;
                    return 1;
                }
                if (r == TC_ERR_CLOSED) s->_closed = true;
            }
            if (impl->shutdown) return -1;
            {
                /* every stream closed (in this call or before): the tree is over, and
                 * nothing could ever arrive to end a blocking wait */
                std::lock_guard<std::mutex> g(impl->mu);
                /* the point-to-point stream is the layer's own: open as long as the
                 * network, so it waits for answers but does not keep a wait alive once
                 * every back-end is gone */
                bool any = false, open = false, tool_open = false;
                for (std::map<unsigned int, Stream *>::iterator it = impl->streams.begin(); it != impl->streams.end();
                     ++it) {
                    any = true;
                    open = open || !it->second->_closed;
                    tool_open = tool_open || (!it->second->_closed && it->second != impl->p2p);
                }
                if (any && !open && tc_network_backends(impl->net) > 0) return -1;
                /* no stream of the tool's open: nothing tells this loop that the tree
                 * ended but the events (the network closed, or every back-end lost or gone) */
                if (!tool_open && iblocking && !impl->events_wanted) {
                    impl->events_wanted = true;
                    start_events(this, impl);
                }
                size_t backends = tc_network_backends(impl->net), lost = 0;
                for (std::set<Rank>::iterator it = impl->gone.begin(); it != impl->gone.end(); ++it)
                    if (*it < backends) lost++;
                if (!tool_open && backends > 0 && lost >= backends) return -1;
            }
            if (impl->shutdown) return -1;
        }
        if (!iblocking) return 0;
        wait_fd(impl->data_fd, (int)SLICE_MS);
    }
}

int Network::send(Rank ibe, int itag, const char *iformat_str, ...) {
    va_list ap;
    va_start(ap, iformat_str);
    PacketPtr p(new Packet(iformat_str, ap, 0, itag));
    va_end(ap);
    return send(ibe, p);
}

int Network::send(Rank ibe, const char *idata_fmt, va_list idata, int itag) {
    PacketPtr p(new Packet(idata_fmt, idata, 0, itag));
    return send(ibe, p);
}

int Network::send(Rank ibe, int itag, const void **idata, const char *iformat_str) {
    PacketPtr p(new Packet(0, itag, idata, iformat_str));
    return send(ibe, p);
}

int Network::send(Rank ibe, PacketPtr &ipacket) {
    NetworkImpl *impl = _impl;
    if (!impl->fe || !impl->net || !ipacket || ipacket->has_Error()) return -1;
    Stream *p2p = p2p_stream(this, impl);
    if (!p2p) return -1;
    std::vector<tc_value> vals;
    to_values(*ipacket, vals);
    std::string fmt = tc_format(*ipacket);
    if (tc_stream_send_values_to(p2p->_tc, ibe, ipacket->get_Tag(), fmt.c_str(),
                                 vals.empty() ? NULL : &vals[0], vals.size()) != TC_OK) {
        fail(this, ERR_NETWORK_FAILURE, "sending to one back-end");
        return -1;
    }
    return 0;
}

/* MRNet's flush waits until its send thread has written the packets. Here a send
 * is already in treecast's hands, which write it with no further call (at the next
 * call that waits, at a send a millisecond or so later, or from the library's thread
 * within milliseconds once calls stop). So a flush waits for the write at most once
 * a millisecond (once per tick of the coarse clock, at most 4 ms): a burst's
 * packets share their writes (waiting for each one cost MRNet's own micro-benchmark
 * four fifths of its throughput, docs/mrnet-compat.md), and a tool that flushes now
 * and then has each flush written at once. What was sent before exit() is still
 * written (drain_at_exit). */
static const int64_t FLUSH_EVERY_NS = 1000000;

/* A flush that waits gives up after this long (MRNet's has no limit, but a peer that
 * stopped reading must not hang the tool). */
static const uint64_t FLUSH_LIMIT_MS = 60000;

/* A monotonic clock in ns, read at every flush: the coarse one (3 ns a read against
 * the precise clock's 20, which were a tenth of a back-end's cost per packet) where
 * its tick is 4 ms or less, else the precise one. A burst's flush then waits once
 * per tick, and one after a quiet spell at once. */
static int64_t now_ns(void) {
    static const bool coarse = [] {
        struct timespec res;
        return clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0 && res.tv_sec == 0 && res.tv_nsec <= 4000000;
    }();
    struct timespec t;
    if (clock_gettime(coarse ? CLOCK_MONOTONIC_COARSE : CLOCK_MONOTONIC, &t) != 0)
        return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int Network::flush(void) const {
    if (_impl->fe && !_impl->net) return attaching(_impl) ? 0 : -1; /* attach mode: nothing was sent yet */
    if (!_impl->net && !_impl->be) return -1;
    int64_t now = now_ns();
    if (now - _impl->last_flush_ns.load() < FLUSH_EVERY_NS) return 0;
    tc_result r = _impl->fe ? tc_network_flush(_impl->net, FLUSH_LIMIT_MS) : tc_backend_flush(_impl->be, FLUSH_LIMIT_MS);
    _impl->last_flush_ns.store(now_ns());
    if (r != TC_OK) {
        fail(this, ERR_NETWORK_FAILURE, "flushing");
        return -1;
    }
    return 0;
}

/* ---- events ---- */

static void deliver(Network *net, NetworkImpl *impl, EventClass cls, EventType typ, EventData *data) {
    std::vector<evt_cb_info> run;
    {
        std::lock_guard<std::mutex> g(impl->mu);
        EventClass classes[2] = {cls, Event::EVENT_CLASS_ALL};
        for (int c = 0; c < 2; c++) {
            std::map<EventClass, std::map<EventType, evt_cb_list> >::iterator ci = impl->callbacks.find(classes[c]);
            if (ci == impl->callbacks.end()) continue;
            EventType types[2] = {typ, Event::EVENT_TYPE_ALL};
            for (int t = 0; t < 2; t++) {
                std::map<EventType, evt_cb_list>::iterator ti = ci->second.find(types[t]);
                if (ti == ci->second.end()) continue;
                for (evt_cb_list::iterator it = ti->second.begin(); it != ti->second.end();) {
                    run.push_back(*it);
                    if (it->onetime)
                        it = ti->second.erase(it);
                    else
                        ++it;
                }
            }
        }
    }
    (void)net;
    /* The callbacks run before the event is queued: once queued, a tool thread may
     * take it (next_Event) or free it (clear_Events) at any time. */
    Event ev(cls, typ, data);
    for (size_t i = 0; i < run.size(); i++) {
        try {
            run[i].func(&ev, run[i].data);
        } catch (...) {
            if (CUR_OUTPUT_LEVEL >= 1) fprintf(stderr, "mrnet: an event callback threw an exception: ignored\n");
        }
    }
    std::lock_guard<std::mutex> g(impl->mu);
    if (impl->queue.size() < 4096)
        impl->queue.push_back(new Event(cls, typ, data));
    else
        delete data; /* the queue is full and nobody reads it */
    EventClass notify[2] = {cls, Event::EVENT_CLASS_ALL};
    for (int c = 0; c < 2; c++) {
        std::map<EventClass, int[2]>::iterator pi = impl->pipes.find(notify[c]);
        if (pi != impl->pipes.end()) {
            char b = 1;
            if (write(pi->second[1], &b, 1) < 0) { /* full: it is readable anyway */
            }
        }
    }
}

/* "0-3,8" -> every rank. */
static std::vector<Rank> unfold(const char *s) {
    std::vector<Rank> out;
    while (s && *s) {
        char *end = NULL;
        unsigned long a = strtoul(s, &end, 10);
        unsigned long b = a;
        if (end == s) break;
        if (*end == '-') {
            const char *t = end + 1;
            b = strtoul(t, &end, 10);
        }
        for (unsigned long r = a; r <= b && out.size() < 1000000; r++) out.push_back((Rank)r);
        s = *end == ',' ? end + 1 : end;
        if (*s && *s != ',' && !(*s >= '0' && *s <= '9')) break;
    }
    return out;
}

static void event_loop(Network *net, NetworkImpl *impl) {
    while (!impl->stop) {
        tc_event *ev = NULL;
        tc_result r = tc_network_next_event(impl->net, 200, &ev);
        if (r == TC_ERR_TIMEOUT || r == TC_ERR_AGAIN) continue;
        if (r != TC_OK) {
            impl->shutdown = true;
            return;
        }
        uint32_t kind = tc_event_kind(ev);
        std::vector<Rank> ranks = unfold(tc_event_ranks(ev));
        const char *text = tc_event_message(ev); /* NULL only if the C API failed inside */
        std::string msg = text ? text : "";
        if (CUR_OUTPUT_LEVEL >= 2) fprintf(stderr, "mrnet: event: %s\n", msg.c_str());
        switch (kind) {
        case TC_EVENT_RANKS_LOST:
        case TC_EVENT_RANKS_LEFT:
        case TC_EVENT_NODE_LOST:
            if (kind != TC_EVENT_NODE_LOST) { /* a lost node's back-ends may rejoin */
                std::lock_guard<std::mutex> g(impl->mu);
                impl->gone.insert(ranks.begin(), ranks.end());
            }
            if (ranks.empty()) ranks.push_back(UnknownRank);
            for (size_t i = 0; i < ranks.size(); i++)
                deliver(net, impl, Event::TOPOLOGY_EVENT, TopologyEvent::TOPOL_REMOVE_NODE,
                        new TopologyEvent::TopolEventData(ranks[i], UnknownRank));
            break;
        case TC_EVENT_RANKS_REJOINED:
            for (size_t i = 0; i < ranks.size(); i++)
                deliver(net, impl, Event::TOPOLOGY_EVENT, TopologyEvent::TOPOL_CHANGE_PARENT,
                        new TopologyEvent::TopolEventData(ranks[i], UnknownRank));
            break;
        case TC_EVENT_RANKS_JOINED:
            for (size_t i = 0; i < ranks.size(); i++) {
                /* attach mode: the launch's back-ends were announced when they attached */
                NetworkTopology::Node *known = impl->topo ? impl->topo->find_Node(ranks[i]) : NULL;
                if (known && known->is_BackEnd()) continue;
                deliver(net, impl, Event::TOPOLOGY_EVENT, TopologyEvent::TOPOL_ADD_BE,
                        new TopologyEvent::TopolEventData(ranks[i], UnknownRank));
            }
            break;
        case TC_EVENT_FILTER_ERROR:
        case TC_EVENT_STREAM_REFUSED:
            deliver(net, impl, Event::ERROR_EVENT, ErrorEvent::ERROR_INTERNAL,
                    new ErrorEvent::ErrorEventData(tc_event_rank(ev), msg));
            break;
        default:
            deliver(net, impl, Event::ERROR_EVENT, ErrorEvent::ERROR_SYSTEM,
                    new ErrorEvent::ErrorEventData(tc_event_rank(ev), msg));
        }
        tc_event_free(ev);
    }
}

void Network::clear_Events() {
    want_events(this, _impl);
    std::lock_guard<std::mutex> g(_impl->mu);
    for (std::list<Event *>::iterator it = _impl->queue.begin(); it != _impl->queue.end(); ++it) {
        delete (*it)->get_Data();
        delete *it;
    }
    _impl->queue.clear();
}

unsigned int Network::num_EventsPending() {
    want_events(this, _impl);
    std::lock_guard<std::mutex> g(_impl->mu);
    return (unsigned int)_impl->queue.size();
}

Event *Network::next_Event() {
    want_events(this, _impl);
    std::lock_guard<std::mutex> g(_impl->mu);
    if (_impl->queue.empty()) return NULL;
    Event *e = _impl->queue.front();
    _impl->queue.pop_front();
    return e;
}

int Network::get_EventNotificationFd(EventClass etyp) {
    /* data: treecast's own descriptor, readable when a packet arrives on any stream */
    if (etyp == Event::DATA_EVENT) return data_fd(_impl);
    want_events(this, _impl);
    std::lock_guard<std::mutex> g(_impl->mu);
    std::map<EventClass, int[2]>::iterator it = _impl->pipes.find(etyp);
    if (it != _impl->pipes.end()) return it->second[0];
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    _impl->pipes[etyp][0] = fds[0];
    _impl->pipes[etyp][1] = fds[1];
    return fds[0];
}

void Network::clear_EventNotificationFd(EventClass etyp) {
    if (etyp == Event::DATA_EVENT) {
        if (_impl->net) tc_network_fd_clear(_impl->net);
        if (_impl->be) tc_backend_fd_clear(_impl->be);
        return;
    }
    std::lock_guard<std::mutex> g(_impl->mu);
    std::map<EventClass, int[2]>::iterator it = _impl->pipes.find(etyp);
    if (it == _impl->pipes.end()) return;
    char buf[256];
    while (read(it->second[0], buf, sizeof buf) > 0) {
    }
}

void Network::close_EventNotificationFd(EventClass etyp) {
    if (etyp == Event::DATA_EVENT) return; /* the network's own: it stays open */
    std::lock_guard<std::mutex> g(_impl->mu);
    std::map<EventClass, int[2]>::iterator it = _impl->pipes.find(etyp);
    if (it == _impl->pipes.end()) return;
    close(it->second[0]);
    close(it->second[1]);
    _impl->pipes.erase(it);
}

bool Network::register_EventCallback(EventClass iclass, EventType ityp, evt_cb_func ifunc, void *idata,
                                     bool onetime) {
    if (!ifunc) return false;
    {
        std::lock_guard<std::mutex> g(_impl->mu);
        _impl->callbacks[iclass][ityp].push_back(evt_cb_info(ifunc, idata, onetime));
    }
    want_events(this, _impl);
    return true;
}

bool Network::remove_EventCallback(evt_cb_func func, EventClass iclass, EventType ityp) {
    std::lock_guard<std::mutex> g(_impl->mu);
    evt_cb_list &l = _impl->callbacks[iclass][ityp];
    size_t before = l.size();
    for (evt_cb_list::iterator it = l.begin(); it != l.end();)
        if (it->func == func)
            it = l.erase(it);
        else
            ++it;
    return l.size() != before;
}

bool Network::remove_EventCallbacks(EventClass iclass, EventType ityp) {
    std::lock_guard<std::mutex> g(_impl->mu);
    _impl->callbacks[iclass][ityp].clear();
    return true;
}

bool Network::set_FailureRecovery(bool) { return true; }

/* ---- Stream ---- */

Stream::Stream(Network *net, unsigned int id, const std::set<Rank> &ranks, int us, int sync, int ds)
    : _network(net), _tc(NULL), _id(id), _ranks(ranks), _broadcast(false), _us_filter(us), _sync_filter(sync), _ds_filter(ds),
      _sync_timeout_ms(1000), _closed(false), _private(false) {}

Stream *be_stream(Network *n, NetworkImpl *impl, unsigned int id) {
    std::lock_guard<std::mutex> g(impl->mu);
    std::map<unsigned int, Stream *>::iterator it = impl->streams.find(id);
    if (it != impl->streams.end()) return it->second;
    Stream *s = new Stream(n, id, std::set<Rank>(), TFILTER_NULL, SFILTER_WAITFORALL, TFILTER_NULL);
    impl->streams[id] = s;
    return s;
}

Stream::~Stream() {
    NetworkImpl *impl = _network ? _network->_impl : NULL;
    if (impl) {
        std::lock_guard<std::mutex> g(impl->mu);
        impl->all_streams.remove(this);
        std::map<unsigned int, Stream *>::iterator it = impl->streams.find(_id);
        if (it != impl->streams.end() && it->second == this) impl->streams.erase(it);
        if (impl->p2p == this) impl->p2p = NULL;
        std::map<Rank, Stream *>::iterator p = impl->privates.find(_id);
        if (_private && p != impl->privates.end() && p->second == this) impl->privates.erase(p);
    }
    if (_tc) tc_stream_free(_tc);
}

/* The treecast name of a built-in filter id; NULL for a loaded one or an unknown id. */
static const char *builtin(int id) {
    if (id == TFILTER_NULL) return "null";
    if (id == TFILTER_SUM) return "sum";
    if (id == TFILTER_AVG) return "avg";
    if (id == TFILTER_MIN) return "min";
    if (id == TFILTER_MAX) return "max";
    if (id == TFILTER_ARRAY_CONCAT) return "concat";
    if (id == TFILTER_INT_EQ_CLASS) return "eqclass";
    return NULL;
}

/* The adapter's parameters: the function, the object's identity and bytes (only at
 * creation), then the tool's own. */
static void adapter_params(const LoadedFilter &lf, bool with_bytes, const Packet *user, std::string &fmt,
                           std::vector<tc_value> &vals) {
    vals.clear();
    tc_value v;
    memset(&v, 0, sizeof v);
    v.kind = TC_TYPE_STRING;
    v.ptr = lf.func.c_str();
    vals.push_back(v);
    v.ptr = lf.identity.c_str();
    vals.push_back(v);
    v.kind = TC_TYPE_BYTES;
    v.ptr = with_bytes && !lf.bytes.empty() ? &lf.bytes[0] : (const void *)"";
    v.len = with_bytes ? lf.bytes.size() : 0;
    vals.push_back(v);
    fmt = "%s %s %b";
    if (user && user->get_NumDataElements()) {
        std::vector<tc_value> more;
        to_values(*user, more);
        vals.insert(vals.end(), more.begin(), more.end());
        fmt += " " + tc_format(*user);
    }
}

bool Stream::ensure(void) const {
    NetworkImpl *impl = _network->_impl;
    if (_private) return p2p_stream(_network, impl) != NULL;
    /* two tool threads sending on a new stream must not both make it */
    std::lock_guard<std::mutex> making(impl->make_mu);
    if (_tc) return true;
    if (!impl->fe) return false;
    /* attach mode: a stream is made once every back-end attached */
    if (!wait_attached(impl)) {
        std::string why;
        {
            std::lock_guard<std::mutex> g(impl->mu);
            why = impl->attach_error.empty() ? "the network is not running" : impl->attach_error;
        }
        _network->error(ERR_NETWORK_FAILURE, UnknownRank, "making a stream: %s", why.c_str());
        return false;
    }
    const LoadedFilter *up = NULL, *down = NULL;
    {
        std::lock_guard<std::mutex> g(impl->mu);
        int u = _us_filter - FIRST_LOADED_FILTER, d = _ds_filter - FIRST_LOADED_FILTER;
        if (u >= 0 && (size_t)u < impl->filters.size()) up = &impl->filters[u];
        if (d >= 0 && (size_t)d < impl->filters.size()) down = &impl->filters[d];
        if (_broadcast && impl->bcast) _ranks = impl->bcast->_ranks;
    }
    if ((up || down) && !load_adapter(_network, impl)) return false;
    const char *up_name = up ? ADAPTER_NAME : builtin(_us_filter);
    const char *down_name = down ? ADAPTER_NAME : builtin(_ds_filter);
    if (!up_name || !down_name) {
        _network->error(ERR_INTERNAL, UnknownRank, "new_Stream: no filter has id %d",
                        up_name ? _ds_filter : _us_filter);
        return false;
    }
    uint32_t sync = TC_SYNC_WAIT_FOR_ALL;
    if (_sync_filter == SFILTER_DONTWAIT) sync = TC_SYNC_DO_NOT_WAIT;
    if (_sync_filter == SFILTER_TIMEOUT) sync = TC_SYNC_TIME_OUT;
    tc_communicator *comm = NULL;
    std::string ranks = fold(_ranks);
    if (tc_communicator_new(impl->net, ranks.c_str(), &comm) != TC_OK) {
        fail(_network, ERR_INTERNAL, "making the stream's communicator");
        return false;
    }
    tc_result r;
    std::string fmt;
    std::vector<tc_value> vals;
    if (up) {
        adapter_params(*up, true, _up_params.get(), fmt, vals);
        r = tc_stream_new_params(impl->net, comm, up_name, down_name, sync, _sync_timeout_ms, fmt.c_str(), &vals[0],
                                 vals.size(), &_tc);
    } else if (_up_params && _up_params->get_NumDataElements()) {
        to_values(*_up_params, vals);
        fmt = tc_format(*_up_params);
        r = tc_stream_new_params(impl->net, comm, up_name, down_name, sync, _sync_timeout_ms, fmt.c_str(), &vals[0],
                                 vals.size(), &_tc);
    } else {
        r = tc_stream_new(impl->net, comm, up_name, down_name, sync, _sync_timeout_ms, &_tc);
    }
    tc_communicator_free(comm);
    if (r != TC_OK) {
        _tc = NULL;
        fail(_network, ERR_INTERNAL, "making the stream");
        return false;
    }
    if (down) {
        adapter_params(*down, true, _down_params.get(), fmt, vals);
        if (tc_stream_set_down_params_values(_tc, fmt.c_str(), &vals[0], vals.size()) != TC_OK)
            fail(_network, ERR_INTERNAL, "setting the downstream filter");
    }
    _id = compat::mrn_stream_id(tc_stream_id(_tc));
    std::lock_guard<std::mutex> g(impl->mu);
    impl->streams[_id] = const_cast<Stream *>(this);
    return true;
}

unsigned int Stream::get_Id(void) const {
    if (_network->_impl->fe && !_private) ensure();
    return _id;
}

int Stream::send_packet(Packet &p) {
    NetworkImpl *impl = _network->_impl;
    if (p.has_Error()) {
        _network->error(p.get_Error(), UnknownRank, "send: the values do not match the format string");
        return -1;
    }
    std::vector<tc_value> vals;
    to_values(p, vals);
    std::string fmt = tc_format(p);
    if (impl->fe) return fe_send(p.get_Tag(), fmt.c_str(), vals.empty() ? NULL : &vals[0], vals.size());
    if (!impl->be) return -1;
    tc_result r = tc_backend_send_values(impl->be, tc_stream_id_of(_id), p.get_Tag(), fmt.c_str(),
                                         vals.empty() ? NULL : &vals[0], vals.size());
    if (r != TC_OK) {
        fail(_network, ERR_NETWORK_FAILURE, "sending on a stream");
        return -1;
    }
    return 0;
}

int Stream::fe_send(int itag, const char *fmt, const tc_value *vals, size_t count) {
    tc_result r;
    if (_private) {
        Stream *p2p = p2p_stream(_network, _network->_impl);
        if (!p2p) return -1;
        r = tc_stream_send_values_to(p2p->_tc, _id, itag, fmt, vals, count);
    } else {
        if (!ensure()) return -1;
        r = tc_stream_send_values(_tc, itag, fmt, vals, count);
    }
    if (r != TC_OK) {
        fail(_network, ERR_NETWORK_FAILURE, _private ? "sending to one back-end" : "sending on a stream");
        return -1;
    }
    return 0;
}

/* A thread's reading of the last format string it sent with, and the value array its
 * sends fill: one thread-local (each costs a lookup in a shared library), so a send
 * loop allocates and parses nothing. */
struct SendScratch {
    std::string last_fmt, last_tc;
    std::vector<DataType> types;
    std::vector<uint32_t> kinds; /* treecast's type code of each */
    std::vector<tc_value> vals;
    bool have_last;
    SendScratch() : have_last(false) {}
};

/* The values of MRNet-style variadic arguments, straight into treecast's value array
 * (no Packet on the way: sends are the hot path), in `sc.vals`, with their treecast
 * format in `sc.last_tc`; false on an unknown specifier. */
static bool va_values(const char *fmt, va_list *ap, SendScratch &sc) {
    if (!fmt) return false;
    if (!sc.have_last || strcmp(sc.last_fmt.c_str(), fmt) != 0) {
        std::vector<DataType> types;
        if (!format_types(fmt, types)) return false;
        std::string tc;
        std::vector<uint32_t> kinds;
        for (size_t i = 0; i < types.size(); i++) {
            if (i) tc += ' ';
            tc += tc_spec(types[i]);
            kinds.push_back(tc_code(types[i]));
        }
        sc.last_fmt = fmt;
        sc.last_tc.swap(tc);
        sc.types.swap(types);
        sc.kinds.swap(kinds);
        sc.have_last = true;
    }
    const std::vector<DataType> &types = sc.types;
    std::vector<tc_value> &vals = sc.vals;
    vals.resize(types.size());
    for (size_t i = 0; i < types.size(); i++) {
        DataType t = types[i];
        tc_value &v = vals[i];
        memset(&v, 0, sizeof v);
        v.kind = sc.kinds[i];
        switch (t) {
        case CHAR_T: v.i = (char)va_arg(*ap, int); break;
        case UCHAR_T: v.u = (unsigned char)va_arg(*ap, unsigned int); break;
        case INT16_T: v.i = (int16_t)va_arg(*ap, int); break;
        case UINT16_T: v.u = (uint16_t)va_arg(*ap, unsigned int); break;
        case INT32_T: v.i = va_arg(*ap, int32_t); break;
        case UINT32_T: v.u = va_arg(*ap, uint32_t); break;
        case INT64_T: v.i = va_arg(*ap, int64_t); break;
        case UINT64_T: v.u = va_arg(*ap, uint64_t); break;
        case FLOAT_T: v.d = (float)va_arg(*ap, double); break;
        case DOUBLE_T: v.d = va_arg(*ap, double); break;
        case STRING_T: {
            const char *str = va_arg(*ap, const char *);
            v.ptr = str ? str : "";
            break;
        }
        default:
            v.ptr = va_arg(*ap, const void *);
            v.len = is_large_array(t) ? (size_t)va_arg(*ap, uint64_t) : (size_t)va_arg(*ap, uint32_t);
            if (!v.ptr && v.len == 0) v.ptr = "";
        }
    }
    return true;
}

int Stream::send(int itag, const char *iformat_str, ...) {
    va_list ap;
    va_start(ap, iformat_str);
    int rc = send_va(itag, iformat_str, &ap);
    va_end(ap);
    return rc;
}

int Stream::send_va(int itag, const char *iformat_str, va_list *ap) {
    NetworkImpl *impl = _network->_impl;
    static thread_local SendScratch sc;
    if (!va_values(iformat_str, ap, sc)) {
        _network->error(ERR_FORMATSTR, UnknownRank, "send: bad format string \"%s\"",
                        iformat_str ? iformat_str : "(null)");
        return -1;
    }
    const std::vector<tc_value> &vals = sc.vals;
    const char *fmt = sc.last_tc.c_str();
    const tc_value *v = vals.empty() ? NULL : &vals[0];
    if (impl->fe) return fe_send(itag, fmt, v, vals.size());
    if (!impl->be) return -1;
    tc_result r = tc_backend_send_values(impl->be, tc_stream_id_of(_id), itag, fmt, v, vals.size());
    if (r != TC_OK) {
        fail(_network, ERR_NETWORK_FAILURE, "sending on a stream");
        return -1;
    }
    return 0;
}

int Stream::send(const char *idata_fmt, va_list idata, int itag) {
    va_list ap;
    va_copy(ap, idata);
    int rc = send_va(itag, idata_fmt, &ap);
    va_end(ap);
    return rc;
}

int Stream::send(int itag, const void **idata, const char *iformat_str) {
    Packet p(_id, itag, idata, iformat_str);
    return send_packet(p);
}

int Stream::send(PacketPtr &ipacket) { return ipacket ? send_packet(*ipacket) : -1; }

int Stream::flush(void) const { return _network->flush(); }

int Stream::private_recv(int *otag, PacketPtr &opacket, bool iblocking) {
    NetworkImpl *impl = _network->_impl;
    Stream *p2p = p2p_stream(_network, impl);
    if (!p2p) return -1;
    for (;;) {
        {
            std::lock_guard<std::mutex> g(impl->mu);
            if (!_pending.empty()) {
                opacket = _pending.front();
                _pending.pop_front();
                PrivateStreams::taken_locked(impl);
                if (otag) *otag = opacket->get_Tag();
                return 1;
            }
            if (iblocking && !impl->events_wanted) {
                impl->events_wanted = true;
                start_events(_network, impl);
            }
        }
        /* the back-end is lost or gone (the event thread tells; it runs once a tool
         * waits for what only events tell): what it sent before is still taken, then
         * nothing more can come */
        bool gone;
        {
            std::lock_guard<std::mutex> g(impl->mu);
            gone = impl->gone.count(_id) > 0;
        }
        /* a short slice: another thread's receive may take this stream's packet */
        tc_packet *p = NULL;
        tc_result r = tc_stream_recv(p2p->_tc, iblocking && !gone ? BE_SLICE_MS : 0, &p);
        if (r == TC_OK) {
            PacketPtr pk = from_tc(p);
            tc_packet_free(p);
            if (pk->get_SourceRank() == _id) {
                PrivateStreams::clear_fd(impl, p2p);
                pk->set_StreamId(_id);
                opacket = pk;
                if (otag) *otag = pk->get_Tag();
                return 1;
            }
            /* another back-end's: kept for its stream, the descriptor left readable */
            PrivateStreams::park(_network, impl, pk);
            continue;
        }
        if (gone && (r == TC_ERR_AGAIN || r == TC_ERR_TIMEOUT)) {
            _closed = true;
            return -1;
        }
        if (r == TC_ERR_AGAIN || (r == TC_ERR_TIMEOUT && !iblocking)) return 0;
        if (r == TC_ERR_TIMEOUT || r == TC_ERR_NO_ANSWER) continue;
        if (r == TC_ERR_CLOSED) _closed = true;
        fail(_network, ERR_NETWORK_FAILURE, "receiving on a back-end's private stream");
        return -1;
    }
}

int Stream::recv(int *otag, PacketPtr &opacket, bool iblocking) {
    NetworkImpl *impl = _network->_impl;
    if (impl->fe) {
        if (_private) return private_recv(otag, opacket, iblocking);
        if (!ensure()) return -1;
        for (;;) {
            tc_packet *p = NULL;
            tc_result r = tc_stream_recv(_tc, iblocking ? SLICE_MS : 0, &p);
            if (r == TC_OK) {
                /* the stream's descriptor stays readable only while packets are queued */
                tc_stream_fd_clear(_tc);
                opacket = from_tc(p);
                tc_packet_free(p);
                if (otag) *otag = opacket->get_Tag();
                return 1;
            }
            if (r == TC_ERR_AGAIN || (r == TC_ERR_TIMEOUT && !iblocking)) return 0;
            if (r == TC_ERR_TIMEOUT || r == TC_ERR_NO_ANSWER) continue;
            if (r == TC_ERR_CLOSED) _closed = true;
            fail(_network, ERR_NETWORK_FAILURE, "receiving on a stream");
            return -1;
        }
    }
    for (;;) {
        {
            std::lock_guard<std::mutex> g(impl->mu);
            if (!_pending.empty()) {
                opacket = _pending.front();
                _pending.pop_front();
                if (otag) *otag = opacket->get_Tag();
                return 1;
            }
            /* its closing was taken before (by another call): nothing more can come */
            if (_closed) return -1;
        }
        PacketPtr p;
        unsigned int closed = 0;
        int got = be_poll(_network, impl, p, closed, iblocking ? BE_SLICE_MS : 0);
        if (got == 1) {
            if (p->get_StreamId() == _id) {
                opacket = p;
                if (otag) *otag = p->get_Tag();
                return 1;
            }
            Stream *other = be_stream(_network, impl, p->get_StreamId());
            std::lock_guard<std::mutex> g(impl->mu);
            other->_pending.push_back(p);
            continue;
        }
        if (got == 2) {
            be_stream(_network, impl, closed)->_closed = true;
            if (closed == _id) return -1;
            continue;
        }
        if (got < 0) return -1;
        if (!iblocking) return 0;
    }
}

bool Stream::has_Data(void) {
    NetworkImpl *impl = _network->_impl;
    if (impl->fe && _private) {
        /* what treecast holds for any private stream goes to its own */
        Stream *p2p = NULL;
        {
            std::lock_guard<std::mutex> g(impl->mu);
            p2p = impl->p2p;
        }
        tc_packet *p = NULL;
        struct tc_stream *tc = PrivateStreams::made(impl, p2p);
        while (tc && tc_stream_recv(tc, 0, &p) == TC_OK) {
            PacketPtr pk = from_tc(p);
            tc_packet_free(p);
            PrivateStreams::park(_network, impl, pk);
        }
    }
    if (!impl->fe || _private) {
        std::lock_guard<std::mutex> g(impl->mu);
        return !_pending.empty();
    }
    return false;
}

/* The front-end: the stream's own descriptor, readable once a packet for this stream
 * is queued (the stream is made in the tree now if it was not yet). A back-end: the
 * network's, as its packets for every stream come through one receive. */
int Stream::get_DataNotificationFd(void) {
    NetworkImpl *impl = _network->_impl;
    if (!impl->fe) return data_fd(impl);
    if (!ensure()) return -1;
    int fd = -1;
    if (_private) {
        /* every private stream's: readable while any back-end's answer waits */
        Stream *p2p = p2p_stream(_network, impl);
        fd = p2p ? PrivateStreams::fd(impl, p2p) : -1;
        if (fd < 0) fail(_network, ERR_SYSTEM, "making the private streams' data descriptor");
        return fd;
    }
    if (tc_stream_fd(_tc, &fd) != TC_OK) {
        fail(_network, ERR_SYSTEM, "making the stream's data descriptor");
        return -1;
    }
    return fd;
}

/* As MRNet's: unreadable until the next packet for the stream (at the front-end it
 * stays readable while packets for the stream are still queued). */
void Stream::clear_DataNotificationFd(void) {
    NetworkImpl *impl = _network->_impl;
    if (impl->fe) {
        if (!_private) {
            if (_tc) tc_stream_fd_clear(_tc);
            return;
        }
        /* nothing made for it: clearing a descriptor that was never handed out */
        Stream *p2p = NULL;
        {
            std::lock_guard<std::mutex> g(impl->mu);
            p2p = impl->p2p;
        }
        if (PrivateStreams::made(impl, p2p)) PrivateStreams::clear_fd(impl, p2p);
        return;
    }
    if (impl->be) tc_backend_fd_clear(impl->be);
}

void Stream::close_DataNotificationFd(void) {}

int Stream::set_FilterParameters(FilterType ftype, const char *format_str, ...) const {
    va_list ap;
    va_start(ap, format_str);
    int r = set_FilterParameters(format_str, ap, ftype);
    va_end(ap);
    return r;
}

int Stream::set_FilterParameters(const char *params_fmt, va_list params, FilterType ftype) const {
    NetworkImpl *impl = _network->_impl;
    if (!impl->fe) return -1;
    if (_private) {
        _network->error(ERR_INTERNAL, UnknownRank,
                        "set_FilterParameters: a back-end's private stream has no filters (make a stream "
                        "over a communicator of that rank to filter)");
        return -1;
    }
    PacketPtr p(new Packet(params_fmt, params, _id, 0));
    if (p->has_Error()) return -1;
    if (ftype == FILTER_UPSTREAM_SYNC) {
        const DataElement *e = (*p)[0];
        if (!e || _tc) {
            _network->error(ERR_INTERNAL, UnknownRank,
                            "set_FilterParameters(FILTER_UPSTREAM_SYNC): give the time-out (ms) before the "
                            "stream's first use; treecast fixes it when the stream is made");
            return -1;
        }
        uint64_t ms = 0;
        switch (e->get_Type()) {
        case INT32_T: ms = (uint64_t)std::max(0, e->get_int32_t()); break;
        case UINT32_T: ms = e->get_uint32_t(); break;
        case INT64_T: ms = (uint64_t)std::max<int64_t>(0, e->get_int64_t()); break;
        case UINT64_T: ms = e->get_uint64_t(); break;
        default: return -1;
        }
        _sync_timeout_ms = (uint32_t)ms;
        return 0;
    }
    bool up = ftype == FILTER_UPSTREAM_TRANS;
    if (!_tc) {
        (up ? _up_params : _down_params) = p;
        return 0;
    }
    const LoadedFilter *lf = NULL;
    {
        std::lock_guard<std::mutex> g(impl->mu);
        int k = (up ? _us_filter : _ds_filter) - FIRST_LOADED_FILTER;
        if (k >= 0 && (size_t)k < impl->filters.size()) lf = &impl->filters[k];
    }
    std::string fmt;
    std::vector<tc_value> vals;
    if (lf) {
        adapter_params(*lf, false, p.get(), fmt, vals);
    } else {
        to_values(*p, vals);
        fmt = tc_format(*p);
    }
    tc_result r = up ? tc_stream_set_params_values(_tc, fmt.c_str(), vals.empty() ? NULL : &vals[0], vals.size())
                     : tc_stream_set_down_params_values(_tc, fmt.c_str(), vals.empty() ? NULL : &vals[0], vals.size());
    if (r != TC_OK) {
        fail(_network, ERR_INTERNAL, "setting filter parameters");
        return -1;
    }
    return 0;
}

bool Stream::is_Closed(void) const {
    NetworkImpl *impl = _network->_impl;
    if (_closed || impl->shutdown) return true;
    if (impl->be) {
        /* look at what arrived, keeping packets for their streams */
        for (;;) {
            PacketPtr p;
            unsigned int closed = 0;
            int got = be_poll(_network, impl, p, closed, 0);
            if (got == 1) {
                Stream *s = be_stream(_network, impl, p->get_StreamId());
                std::lock_guard<std::mutex> g(impl->mu);
                s->_pending.push_back(p);
            } else if (got == 2) {
                be_stream(_network, impl, closed)->_closed = true;
            } else {
                break;
            }
        }
        return _closed || impl->shutdown;
    }
    return false;
}

}  // namespace MRN
