/* fe.cpp: the front-end of the MRNet-style test (tests/mrnet), written against MRNet
 * 5.0.1's interface and built against a prefix of tools/mrnet-prefix. Usage:
 *   fe TOPOLOGY_FILE BACKEND FILTER_SO OUT_DIR [lightweight]
 * for a tree of 2 comm nodes with 2 back-ends each; `lightweight` when the back-end is
 * be_lightweight.c (it hears of closings only on streams that brought it packets). Prints "mrnet-compat: ok" when
 * every check held; otherwise names the first that failed and exits 1. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <string>

#include "mrnet/MRNet.h"
#include "protocol.h"
#include "xplat/NetUtils.h"

using namespace MRN;

static Network *net = NULL;

static void check(bool ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "fe: FAILED: %s\n", what);
    if (net && net->has_Error()) net->perror("fe: last error");
    exit(1);
}

/* Receives one packet on `s` and returns its "%d". */
static int recv_int(Stream *s, int want_tag) {
    int tag = -1;
    PacketPtr p;
    check(s->recv(&tag, p) == 1, "Stream::recv");
    check(tag == want_tag, "the tag of a reduction");
    int v = 0;
    check(p->unpack("%d", &v) == 0, "unpack %d");
    check(p->get_Tag() == want_tag && p->get_StreamId() == s->get_Id(), "get_Tag and get_StreamId");
    check((*p)[0] && (*p)[0]->get_Type() == INT32_T && (*p)[0]->get_int32_t() == v, "operator[] and get_int32_t");
    return v;
}

static std::atomic<int> removed(0);
static std::atomic<Rank> removed_rank(UnknownRank);
static void on_remove(Event *e, void *data) {
    if (e->get_Class() == Event::TOPOLOGY_EVENT && e->get_Type() == TopologyEvent::TOPOL_REMOVE_NODE) {
        TopologyEvent::TopolEventData *d = (TopologyEvent::TopolEventData *)e->get_Data();
        if (d) removed_rank = d->get_Rank();
        removed++;
        *(int *)data = 1;
    }
}

int main(int argc, char **argv) {
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "lightweight") == 0)) {
        fprintf(stderr, "usage: %s TOPOLOGY BACKEND FILTER_SO OUT_DIR [lightweight]\n", argv[0]);
        return 2;
    }
    set_OutputLevel(1);
    std::string me;
    check(XPlat::NetUtils::GetLocalHostName(me) == 0 && !me.empty(), "XPlat::NetUtils::GetLocalHostName");
    XPlat::NetUtils::NetworkAddress addr;
    check(XPlat::NetUtils::GetNetworkAddress("localhost", addr) == 0 && addr.GetString() == "127.0.0.1",
          "XPlat::NetUtils::GetNetworkAddress(localhost)");

    const char *be_argv[] = {NULL};
    net = Network::CreateNetworkFE(argv[1], argv[2], be_argv);
    check(!net->has_Error(), "CreateNetworkFE");
    check(net->is_LocalNodeFrontEnd() && !net->is_LocalNodeBackEnd() && !net->is_LocalNodeInternal(),
          "is_LocalNode*");
    check(net->set_FailureRecovery(false), "set_FailureRecovery");
    (void)net->get_LocalRank();

    /* the topology */
    NetworkTopology *topo = net->get_NetworkTopology();
    check(topo != NULL, "get_NetworkTopology");
    check(topo->get_NumNodes() == 7, "get_NumNodes == 7");
    std::set<NetworkTopology::Node *> bes;
    topo->get_BackEndNodes(bes);
    check(bes.size() == 4, "get_BackEndNodes: 4");
    std::vector<NetworkTopology::Node *> leaves;
    topo->get_Leaves(leaves);
    check(leaves.size() == 4, "get_Leaves: 4");
    NetworkTopology::Node *root = topo->get_Root();
    check(root && root->get_Children().size() == 2 && root->get_HostName() == "localhost", "get_Root");
    std::set<Rank> be_ranks;
    for (std::set<NetworkTopology::Node *>::iterator it = bes.begin(); it != bes.end(); ++it) {
        be_ranks.insert((*it)->get_Rank());
        check((*it)->get_Children().empty() && (*it)->get_HostName() == "localhost", "a back-end node");
        (void)(*it)->get_Port();
    }
    check(be_ranks.size() == 4 && *be_ranks.begin() == 0 && *be_ranks.rbegin() == 3, "back-end ranks 0-3");
    unsigned int nodes, depth, minf, maxf;
    double avgf, sdf;
    topo->get_TreeStatistics(nodes, depth, minf, maxf, avgf, sdf);
    check(nodes == 7 && depth == 2 && minf == 2 && maxf == 2 && avgf == 2.0 && sdf == 0.0, "get_TreeStatistics");
    std::string printed = std::string(argv[4]) + "/printed.top";
    topo->print_TopologyFile(printed.c_str());
    FILE *pf = fopen(printed.c_str(), "r");
    check(pf != NULL, "print_TopologyFile wrote a file");
    char line[256] = {0};
    check(fgets(line, sizeof line, pf) && strstr(line, "=>"), "print_TopologyFile: MRNet's format");
    fclose(pf);

    /* events: a callback and the descriptor */
    int cb_flag = 0;
    check(net->register_EventCallback(Event::TOPOLOGY_EVENT, TopologyEvent::TOPOL_REMOVE_NODE, on_remove, &cb_flag),
          "register_EventCallback");
    int event_fd = net->get_EventNotificationFd(Event::TOPOLOGY_EVENT);
    check(event_fd >= 0, "get_EventNotificationFd");

    Communicator *all = net->get_BroadcastCommunicator();
    check(all && all->get_EndPoints().size() == 4, "get_BroadcastCommunicator: 4 end points");

    /* built-in sum, wait for all, with the data descriptor */
    Stream *sum = net->new_Stream(all, TFILTER_SUM, SFILTER_WAITFORALL);
    check(sum != NULL, "new_Stream(TFILTER_SUM)");
    check(sum->send(TAG_VALUE, "%d", 2) == 0 && sum->flush() == 0, "Stream::send");
    int data_fd = sum->get_DataNotificationFd();
    check(data_fd >= 0, "get_DataNotificationFd");
    struct pollfd pfd = {data_fd, POLLIN, 0};
    check(poll(&pfd, 1, 60000) == 1, "the data descriptor became readable");
    sum->clear_DataNotificationFd();
    check(recv_int(sum, TAG_VALUE) == 2 * (1 + 2 + 3 + 4), "TFILTER_SUM");

    /* per-stream data descriptors: two streams in one poll loop, only the one a
     * packet is queued for is readable */
    {
        Stream *busy = net->new_Stream(all, TFILTER_SUM, SFILTER_WAITFORALL);
        Stream *idle = net->new_Stream(all, TFILTER_SUM, SFILTER_WAITFORALL);
        check(busy != NULL && idle != NULL, "new_Stream: two streams for the descriptors");
        int bfd = busy->get_DataNotificationFd(), ifd = idle->get_DataNotificationFd();
        check(bfd >= 0 && ifd >= 0 && bfd != ifd, "each stream has a data descriptor of its own");
        struct pollfd both[2] = {{bfd, POLLIN, 0}, {ifd, POLLIN, 0}};
        check(poll(both, 2, 0) == 0, "no stream's descriptor is readable before data");
        check(busy->send(TAG_VALUE, "%d", 3) == 0, "send on the busy stream");
        check(poll(both, 2, 60000) == 1, "one of the two descriptors became readable");
        check((both[0].revents & POLLIN) && !(both[1].revents & POLLIN),
              "the busy stream's descriptor is readable, the idle one's is not");
        busy->clear_DataNotificationFd();
        struct pollfd one = {bfd, POLLIN, 0};
        check(poll(&one, 1, 0) == 1, "cleared with a packet still queued: still readable");
        check(recv_int(busy, TAG_VALUE) == 3 * (1 + 2 + 3 + 4), "the busy stream's sum");
        check(poll(&one, 1, 0) == 0, "the packet taken: the busy descriptor is not readable");
        /* two waves, taken one per wake-up: the second one wakes the loop too */
        check(busy->send(TAG_VALUE, "%d", 1) == 0 && busy->send(TAG_VALUE, "%d", 2) == 0, "two sends");
        int got = 0;
        for (int k = 0; k < 2; k++) {
            one.revents = 0;
            check(poll(&one, 1, 60000) == 1, "the busy descriptor woke for each wave");
            busy->clear_DataNotificationFd();
            got += recv_int(busy, TAG_VALUE);
        }
        check(got == 3 * (1 + 2 + 3 + 4), "both waves of the busy stream");
        check(poll(&one, 1, 0) == 0, "both taken: not readable");
        struct pollfd quiet = {ifd, POLLIN, 0};
        check(poll(&quiet, 1, 0) == 0, "the idle stream's descriptor stayed unreadable");
        delete busy;
        delete idle;
    }

    /* max; Network::recv over any stream */
    Stream *max = net->new_Stream(all, TFILTER_MAX, SFILTER_WAITFORALL);
    check(max->send(TAG_VALUE, "%d", 5) == 0, "send on the max stream");
    int tag = 0;
    PacketPtr p;
    Stream *from = NULL;
    check(net->recv(&tag, p, &from, true) == 1, "Network::recv");
    check(from == max && tag == TAG_VALUE, "Network::recv names the stream");
    int v = 0;
    check(p->unpack("%d", &v) == 0 && v == 20, "TFILTER_MAX");
    check(net->get_Stream(max->get_Id()) == max, "get_Stream");

    /* a sub-communicator */
    std::set<Rank> some;
    some.insert(0);
    some.insert(2);
    Communicator *sub = net->new_Communicator(some);
    check(sub->size() == 2, "new_Communicator: 2 end points");
    Stream *sub_sum = net->new_Stream(sub, TFILTER_SUM, SFILTER_TIMEOUT);
    check(sub_sum->set_FilterParameters(FILTER_UPSTREAM_SYNC, "%ud", 30000u) == 0, "SFILTER_TIMEOUT parameter");
    check(sub_sum->send(TAG_VALUE, "%d", 1) == 0, "send to a sub-communicator");
    check(recv_int(sub_sum, TAG_VALUE) == 1 + 3, "a sum over ranks 0 and 2");

    /* do not wait: every back-end's packet on its own, with its source rank */
    Stream *each = net->new_Stream(all, TFILTER_NULL, SFILTER_DONTWAIT);
    check(each->send(TAG_VALUE, "%d", 1) == 0, "send on a do-not-wait stream");
    std::set<Rank> sources;
    int total = 0;
    for (int i = 0; i < 4; i++) {
        check(each->recv(&tag, p) == 1, "recv on a do-not-wait stream");
        check(p->unpack("%d", &v) == 0, "unpack on a do-not-wait stream");
        check((int)p->get_SourceRank() + 1 == v, "get_SourceRank");
        sources.insert(p->get_SourceRank());
        total += v;
    }
    check(sources.size() == 4 && total == 10, "SFILTER_DONTWAIT: one packet per back-end");

    /* every format code, through rank 1 and back */
    std::set<Rank> one;
    one.insert(1);
    Stream *types = net->new_Stream(net->new_Communicator(one), TFILTER_NULL, SFILTER_DONTWAIT);
    int32_t ad[3] = {-1, 0, 1};
    uint32_t aud[2] = {7, 4000000000u};
    double alf[2] = {0.5, -2.25};
    const char *as[3] = {"a", "", "dotted.host.name"};
    int64_t Ald[2] = {-5000000000LL, 5};
    char Ac[3] = {'x', 'y', 'z'};
    check(types->send(TAG_TYPES, TYPES_FORMAT, 'c', 200, -300, 60000, -7, 4000000000u, (int64_t)-9000000000LL,
                      (uint64_t)18000000000000000000ULL, 1.5, 2.25, "str", ad, 3, aud, 2, alf, 2, as, 3, Ald,
                      (uint64_t)2, Ac, (uint64_t)3) == 0,
          "send of every format code");
    check(types->recv(&tag, p) == 1 && tag == TAG_TYPES, "recv of every format code");
    char c;
    unsigned char uc;
    int16_t hd;
    uint16_t uhd;
    int32_t d;
    uint32_t ud;
    int64_t ld;
    uint64_t uld;
    float f;
    double lf;
    char *str;
    int32_t *rad;
    uint32_t *raud, n_ad, n_aud, n_alf, n_as;
    double *ralf;
    char **ras;
    int64_t *rAld;
    char *rAc;
    uint64_t n_Ald, n_Ac;
    check(p->unpack(TYPES_FORMAT, &c, &uc, &hd, &uhd, &d, &ud, &ld, &uld, &f, &lf, &str, &rad, &n_ad, &raud, &n_aud,
                    &ralf, &n_alf, &ras, &n_as, &rAld, &n_Ald, &rAc, &n_Ac) == 0,
          "unpack of every format code");
    check(c == 'c' && uc == 200 && hd == -300 && uhd == 60000 && d == -7 && ud == 4000000000u &&
              ld == -9000000000LL && uld == 18000000000000000000ULL && f == 1.5f && lf == 2.25,
          "scalars round trip");
    check(strcmp(str, "str") == 0, "%s round trips");
    check(n_ad == 3 && memcmp(rad, ad, sizeof ad) == 0 && n_aud == 2 && memcmp(raud, aud, sizeof aud) == 0 &&
              n_alf == 2 && memcmp(ralf, alf, sizeof alf) == 0,
          "numeric arrays round trip");
    check(n_as == 3 && strcmp(ras[0], "a") == 0 && strcmp(ras[1], "") == 0 &&
              strcmp(ras[2], "dotted.host.name") == 0,
          "%as round trips");
    check(n_Ald == 2 && memcmp(rAld, Ald, sizeof Ald) == 0 && n_Ac == 3 && memcmp(rAc, Ac, 3) == 0,
          "large arrays (%A) round trip");
    DataType dt;
    uint32_t len = 0;
    const void *arr = (*p)[11]->get_array(&dt, &len);
    check(arr && len == 3 && dt == INT32_ARRAY_T && ((const int32_t *)arr)[2] == 1, "DataElement::get_array");
    check(strcmp((*p)[10]->get_string(), "str") == 0 && (*p)[9]->get_double() == 2.25, "DataElement getters");
    check(p->unpack("%d", &d) == -1, "unpack with a wrong format fails");
    free(str);
    free(rad);
    free(raud);
    free(ralf);
    for (uint32_t i = 0; i < n_as; i++) free(ras[i]);
    free(ras);
    free(rAld);
    free(rAc);

    /* a back-end's private stream, as MRNet's singlecast: Network::send to a rank, the
     * answer on get_Stream(rank), whose id is the rank; user streams' ids do not meet ranks */
    check(max->get_Id() >= USER_STRM_BASE_ID, "a user stream's id is USER_STRM_BASE_ID or more");
    check(net->send(2, TAG_VALUE, "%d", 5) == 0 && net->send(0, TAG_VALUE, "%d", 1) == 0 && net->flush() == 0,
          "Network::send to ranks 2 and 0");
    Stream *two = net->get_Stream(2), *zero = net->get_Stream(0);
    check(two && zero && two != zero && two->get_Id() == 2 && zero->get_Id() == 0 && net->get_Stream(2) == two,
          "get_Stream(rank): the back-end's private stream, the same each time");
    check(net->get_Stream(1000) == NULL, "get_Stream of neither a stream nor a back-end's rank");
    /* rank 2's answer may come first: the receive on rank 0's stream keeps it for rank 2's */
    check(zero->recv(&tag, p) == 1 && tag == TAG_VALUE && p->unpack("%d", &v) == 0 && v == 1 &&
              p->get_StreamId() == 0 && p->get_SourceRank() == 0,
          "rank 0's answer on its private stream");
    /* taken with rank 0's or still queued, rank 2's answer shows on the descriptor */
    struct pollfd pfd2 = {two->get_DataNotificationFd(), POLLIN, 0};
    check(pfd2.fd >= 0 && poll(&pfd2, 1, 60000) == 1, "a private stream's descriptor shows its answer");
    check(net->recv(&tag, p, &from, true) == 1 && from == two && p->unpack("%d", &v) == 0 && v == 3 * 5 &&
              p->get_StreamId() == 2,
          "Network::recv names the private stream of the answer");
    two->clear_DataNotificationFd();
    pfd2.revents = 0;
    check(poll(&pfd2, 1, 0) == 0 && !two->has_Data(), "nothing left: the descriptor is cleared");
    check(two->send(TAG_VALUE, "%d", 7) == 0 && two->flush() == 0, "send on a private stream");
    check(recv_int(two, TAG_VALUE) == 3 * 7, "the answer to a send on a private stream");
    check(two->set_FilterParameters(FILTER_UPSTREAM_TRANS, "%d", 1) == -1, "a private stream has no filter");

    /* an MRNet filter function: parameters at creation, then changed; packets sent down */
    int filter = net->load_FilterFunc(argv[3], "ScaledSum");
    check(filter >= 0, "load_FilterFunc");
    check(net->load_FilterFunc(argv[3], "NoSuchFilter") == -1, "load_FilterFunc refuses a function the object lacks");
    Stream *scaled = net->new_Stream(all, filter, SFILTER_WAITFORALL);
    check(scaled->set_FilterParameters(FILTER_UPSTREAM_TRANS, "%d", 10) == 0, "set_FilterParameters before use");
    check(scaled->send(TAG_ECHO, "") == 0, "send on the filter's stream");
    check(recv_int(scaled, TAG_ECHO) == 10 * (1 + 2 + 3 + 4), "the filter's sum, scaled by its parameter");
    /* each comm node sent its partial sum down; each back-end answered it */
    check(recv_int(scaled, TAG_ACK) == 10 * (2 * (1 + 2) + 2 * (3 + 4)), "packets the filter sent down");
    check(scaled->set_FilterParameters(FILTER_UPSTREAM_TRANS, "%d", 3) == 0, "set_FilterParameters at run time");
    check(scaled->send(TAG_VALUE, "%d", 1) == 0, "send after new parameters");
    check(recv_int(scaled, TAG_VALUE) == 3 * 10, "the filter's sum with the new parameter");
    delete scaled;

    /* a lost back-end: the callback runs and the event descriptor wakes */
    Stream *three = net->get_Stream(3);
    check(three != NULL, "rank 3's private stream");
    check(net->send(3, TAG_DIE, "") == 0 && net->flush() == 0, "Network::send to one rank");
    struct pollfd efd = {event_fd, POLLIN, 0};
    check(poll(&efd, 1, 60000) == 1, "the event descriptor became readable");
    net->clear_EventNotificationFd(Event::TOPOLOGY_EVENT);
    for (int i = 0; i < 600 && !cb_flag; i++) usleep(100000);
    check(cb_flag == 1 && removed_rank == 3, "the TOPOL_REMOVE_NODE callback named rank 3");
    check(three->recv(&tag, p) == -1, "a lost back-end's private stream ends");
    Event *e = net->next_Event();
    check(e && e->get_Class() == Event::TOPOLOGY_EVENT, "next_Event");
    delete e->get_Data();
    delete e;

    /* what a back-end sent and flushed just before exit(), its Network never
     * deleted, all arrives, in order */
    {
        std::set<Rank> two;
        two.insert(2);
        Communicator *one = net->new_Communicator(two);
        Stream *last = net->new_Stream(one, TFILTER_NULL, SFILTER_DONTWAIT);
        const int n = 2000;
        check(last->send(TAG_SEND_EXIT, "%d", n) == 0 && last->flush() == 0, "send of the last words");
        int fd = last->get_DataNotificationFd();
        for (int i = 0; i < n; i++) {
            int tag = 0, rc, v = -1;
            PacketPtr p;
            while ((rc = last->recv(&tag, p, false)) == 0) {
                struct pollfd w = {fd, POLLIN, 0};
                check(poll(&w, 1, 60000) == 1, "the packets sent before exit() kept coming");
                last->clear_DataNotificationFd();
            }
            check(rc == 1 && tag == TAG_SEND_EXIT && p->unpack("%d", &v) == 0 && v == i,
                  "every packet sent before exit() arrived, in order");
        }
        delete last;
    }

    /* the others end */
    Stream *ctl = net->new_Stream(all, TFILTER_MAX, SFILTER_WAITFORALL);
    check(ctl->send(TAG_EXIT, "") == 0, "send of the exit");
    /* each back-end answers the number of streams it saw closed: the two of the
     * descriptor check and the filter's; a lightweight back-end never heard of the idle one */
    int closed = argc == 6 ? 2 : 3;
    check(recv_int(ctl, TAG_EXIT) == closed, "the exit wave, without the lost rank, after the streams closed");
    delete ctl;
    delete net;
    net = NULL;
    printf("mrnet-compat: ok\n");
    return 0;
}
