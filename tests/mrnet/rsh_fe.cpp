/* rsh_fe.cpp: an MRNet front-end over hosts other than this one, started through
 * MRNet's remote shell settings (XPLAT_RSH, XPLAT_RSH_ARGS, XPLAT_REMCMD in the
 * environment; tests/mrnet). Usage:
 *   rsh_fe TOPOLOGY_FILE BACKEND
 * for a tree of 2 comm nodes with 2 back-ends each, on made-up hosts that the test's
 * stand-in remote shell runs here. Prints "mrnet-rsh: ok" when a sum over the four
 * back-ends came back; otherwise names what failed and exits 1. */
#include <stdio.h>
#include <stdlib.h>

#include "mrnet/MRNet.h"
#include "protocol.h"

using namespace MRN;

static Network *net = NULL;

static void check(bool ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "rsh_fe: FAILED: %s\n", what);
    if (net && net->has_Error()) net->perror("rsh_fe: last error");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s TOPOLOGY BACKEND\n", argv[0]);
        return 2;
    }
    const char *be_argv[] = {NULL};
    net = Network::CreateNetworkFE(argv[1], argv[2], be_argv);
    check(!net->has_Error(), "CreateNetworkFE over other hosts");
    Communicator *all = net->get_BroadcastCommunicator();
    check(all && all->get_EndPoints().size() == 4, "get_BroadcastCommunicator: 4 end points");
    Stream *sum = net->new_Stream(all, TFILTER_SUM, SFILTER_WAITFORALL);
    check(sum && sum->send(TAG_VALUE, "%d", 1) == 0 && sum->flush() == 0, "send on a sum stream");
    int tag = 0, v = 0;
    PacketPtr p;
    check(sum->recv(&tag, p) == 1 && p->unpack("%d", &v) == 0, "Stream::recv");
    check(tag == TAG_VALUE && v == 1 + 2 + 3 + 4, "the sum over the four back-ends");
    delete sum;
    delete net;
    net = NULL;
    printf("mrnet-rsh: ok\n");
    return 0;
}
