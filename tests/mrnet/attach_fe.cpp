/* attach_fe.cpp: MRNet's attach mode as STAT uses it. CreateNetworkFE with no back-end
 * program builds the tree of comm nodes; the tool reads the leaves (host, port, rank),
 * starts its back-ends itself with fork/exec and MRNet's five arguments (parent host,
 * parent port, parent rank, own host, own rank), waits until every one attached (the
 * TOPOL_ADD_BE callback and get_BackEndNodes), then sums over the broadcast
 * communicator; then the back-ends end and a blocking Network::recv with no stream
 * left returns -1. The back-ends are tests/mrnet/be.cpp; they find the secret through
 * TREECAST_ATTACH, which the front-end exported into its own environment (none of it
 * is on their command line). Usage: attach_fe TOPOLOGY BACKEND N, with
 * TREECAST_MRNET_BACKENDS=N set as a job script would. Prints "mrnet-attach-fe: ok". */
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mrnet/MRNet.h"
#include "protocol.h"

using namespace MRN;

static Network *net = NULL;
static std::vector<pid_t> pids;

static void check(bool ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "attach_fe: FAILED: %s\n", what);
    if (net && net->has_Error()) net->perror("attach_fe: last error");
    for (size_t i = 0; i < pids.size(); i++) kill(pids[i], SIGKILL);
    exit(1);
}

static std::atomic<int> added(0), removed(0), error_events(0);
static void on_error(Event *e, void *) {
    if (e->get_Class() == Event::ERROR_EVENT) error_events++;
}
static void on_topology(Event *e, void *) {
    if (e->get_Class() != Event::TOPOLOGY_EVENT) return;
    if (e->get_Type() == TopologyEvent::TOPOL_ADD_BE) added++;
    if (e->get_Type() == TopologyEvent::TOPOL_REMOVE_NODE) removed++;
}

/* Whether something accepts TCP connections at host:port. */
static bool listening(const std::string &host, Port port) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    std::string service = std::to_string(port);
    if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || !res) return false;
    int fd = socket(res->ai_family, res->ai_socktype, 0);
    bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 5 && !strcmp(argv[4], "short"))) {
        fprintf(stderr, "usage: %s TOPOLOGY BACKEND N [short]\n", argv[0]);
        return 2;
    }
    const int n = atoi(argv[3]);
    /* short: fewer back-ends than TREECAST_MRNET_BACKENDS say are started */
    const bool short_of = argc == 5;
    net = Network::CreateNetworkFE(argv[1], NULL, NULL);
    check(net && !net->has_Error(), "CreateNetworkFE in attach mode");
    check(net->register_EventCallback(Event::TOPOLOGY_EVENT, TopologyEvent::TOPOL_ADD_BE, on_topology, NULL) &&
              net->register_EventCallback(Event::TOPOLOGY_EVENT, TopologyEvent::TOPOL_REMOVE_NODE, on_topology, NULL),
          "register_EventCallback(TOPOL_ADD_BE, TOPOL_REMOVE_NODE)");
    check(net->register_EventCallback(Event::ERROR_EVENT, Event::EVENT_TYPE_ALL, on_error, NULL),
          "register_EventCallback(ERROR_EVENT)");
    NetworkTopology *topo = net->get_NetworkTopology();
    check(topo != NULL, "get_NetworkTopology");
    std::vector<NetworkTopology::Node *> leaves;
    topo->get_Leaves(leaves);
    check(leaves.size() == 2, "the leaves are the topology's 2 comm nodes");
    std::set<NetworkTopology::Node *> bes;
    topo->get_BackEndNodes(bes);
    check(bes.empty(), "no back-end before the tool starts them");
    for (size_t i = 0; i < leaves.size(); i++) {
        check(!leaves[i]->is_BackEnd() && leaves[i]->get_Rank() != UnknownRank, "a leaf is a ranked comm node");
        check(leaves[i]->get_Port() != UnknownPort && leaves[i]->get_Port() > 0, "a leaf has a port");
        check(listening(leaves[i]->get_HostName(), leaves[i]->get_Port()), "a leaf's host and port take connections");
    }
    check(getenv("TREECAST_ATTACH") != NULL, "the front-end exported TREECAST_ATTACH for its children");

    /* As STAT does: each back-end gets its leaf's host, port and rank, and its own
     * rank; leaves take the ranks in blocks, in get_Leaves' order. */
    int next = 0;
    for (size_t l = 0; l < leaves.size(); l++) {
        int count = n / (int)leaves.size() + ((int)l < n % (int)leaves.size() ? 1 : 0);
        for (int k = 0; k < count; k++, next++) {
            std::string host = leaves[l]->get_HostName(), port = std::to_string(leaves[l]->get_Port()),
                        prank = std::to_string(leaves[l]->get_Rank()), rank = std::to_string(next);
            pid_t pid = fork();
            check(pid >= 0, "fork");
            if (pid == 0) {
                execl(argv[2], argv[2], host.c_str(), port.c_str(), prank.c_str(), "localhost", rank.c_str(),
                      (char *)NULL);
                _exit(127);
            }
            pids.push_back(pid);
        }
    }

    if (short_of) {
        /* The launch gives up at its limit (MRNET_STARTUP_TIMEOUT): the tool is told by
         * an error event, a receive fails, a stream cannot be made. */
        int tag = 0;
        PacketPtr p;
        Stream *from = NULL;
        check(net->recv(&tag, p, &from, true) == -1, "Network::recv fails when the back-ends did not all attach");
        for (int i = 0; i < 200 && error_events == 0; i++) usleep(50000);
        check(error_events > 0 && added == 0, "an error event and no TOPOL_ADD_BE");
        Stream *s = net->new_Stream(net->get_BroadcastCommunicator(), TFILTER_SUM, SFILTER_WAITFORALL, TFILTER_NULL);
        check(!s || s->send(TAG_VALUE, "%d", 1) == -1, "no stream over back-ends that did not all attach");
        delete net;
        net = NULL;
        for (size_t i = 0; i < pids.size(); i++) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
        printf("mrnet-attach-fe: short: ok\n");
        return 0;
    }

    /* MRNet's attach flow: wait until every back-end attached. */
    for (int i = 0; i < 1200 && added < n; i++) usleep(50000);
    check(added == n, "a TOPOL_ADD_BE event for each back-end");
    bes.clear();
    topo->get_BackEndNodes(bes);
    check((int)bes.size() == n, "get_BackEndNodes has every attached back-end");
    next = 0;
    for (size_t l = 0; l < leaves.size(); l++) {
        int count = n / (int)leaves.size() + ((int)l < n % (int)leaves.size() ? 1 : 0);
        check((int)leaves[l]->get_NumChildren() == count, "each leaf has its back-ends as children");
        for (int k = 0; k < count; k++, next++) {
            NetworkTopology::Node *be = topo->find_Node((Rank)next);
            check(be && be->is_BackEnd() && be->get_Parent() == leaves[l]->get_Rank(),
                  "a back-end under the leaf it was given");
        }
    }
    Communicator *all = net->get_BroadcastCommunicator();
    check(all && (int)all->get_EndPoints().size() == n, "the broadcast communicator covers every back-end");

    Stream *sum = net->new_Stream(all, TFILTER_SUM, SFILTER_WAITFORALL, TFILTER_NULL);
    check(sum != NULL, "new_Stream(sum)");
    check(sum->send(TAG_VALUE, "%d", 1) == 0 && sum->flush() == 0, "send");
    int tag = 0, v = 0;
    PacketPtr p;
    check(sum->recv(&tag, p) == 1 && tag == TAG_VALUE, "recv the sum");
    check(p->unpack("%d", &v) == 0 && v == n * (n + 1) / 2, "the sum over every attached back-end");
    /* Two threads send to one rank each at once: the layer makes one stream for both,
     * and each answer comes on its back-end's private stream */
    int sent[2] = {-1, -1};
    std::thread a([&]() { sent[0] = net->send(0, TAG_ECHO, ""); });
    std::thread b([&]() { sent[1] = net->send((Rank)(n - 1), TAG_ECHO, ""); });
    a.join();
    b.join();
    check(sent[0] == 0 && sent[1] == 0 && net->flush() == 0, "Network::send to one rank from two threads");
    std::set<int> echoes;
    for (int i = 0; i < 2; i++) {
        Stream *from = NULL;
        check(net->recv(&tag, p, &from, true) == 1 && tag == TAG_ECHO && from, "an answer to a send to one rank");
        check(from == net->get_Stream(p->get_SourceRank()) && from->get_Id() == p->get_SourceRank(),
              "an answer comes on its back-end's private stream");
        check(p->unpack("%d", &v) == 0, "unpack the answer");
        echoes.insert(v);
    }
    check(echoes.size() == 2 && echoes.count(1) && echoes.count(n), "each rank answered once");

    /* Every back-end ends without leaving, and no stream is left: a blocking receive
     * must see the tree over (-1), not wait for ever. */
    check(sum->send(TAG_DIE, "%d", 0) == 0 && sum->flush() == 0, "send the end");
    /* closed at once: a back-end that takes the packet and the closing in one wait
     * must still see the packet first (be.cpp exits 7 otherwise) */
    delete sum;
    for (int i = 0; i < 1200 && removed < n; i++) usleep(50000);
    check(removed == n, "a TOPOL_REMOVE_NODE event for each back-end that ended");
    Stream *from = NULL;
    check(net->recv(&tag, p, &from, true) == -1, "Network::recv with no stream once every back-end is gone");
    delete net;
    net = NULL;
    bool clean = true;
    for (size_t i = 0; i < pids.size(); i++) {
        int status = 0;
        for (int t = 0; t < 300 && waitpid(pids[i], &status, WNOHANG) == 0; t++) usleep(100000);
        if (waitpid(pids[i], &status, WNOHANG) == 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], &status, 0);
            clean = false;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            clean = false;
        }
    }
    pids.clear();
    check(clean, "every back-end ended by itself with status 0");
    printf("mrnet-attach-fe: ok\n");
    return 0;
}
