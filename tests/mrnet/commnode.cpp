/* commnode.cpp: a tool's own comm node program, written as MRNet's mrnet_commnode
 * main is (src/CommunicationNodeMain.C: the program name skipped, CreateNetworkIN,
 * waitfor_ShutDown, delete). fe.cpp runs over it with MRNET_COMM_PATH naming it; each
 * one appends its pid to the file MRNET_TEST_COMMNODE_MARK names, so the test sees it
 * ran as the tree's comm nodes. Started otherwise, CreateNetworkIN must fail. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mrnet/MRNet.h"

using namespace MRN;

int main(int argc, char **argv) {
    argc--;
    argv++;
    Network *net = Network::CreateNetworkIN(argc, argv);
    if (net == NULL || net->has_Error()) {
        if (net) net->perror("commnode");
        fprintf(stderr, "Network::CreateNetworkIN() failed, check args\n");
        delete net;
        return 1;
    }
    if (!net->is_LocalNodeInternal() || net->is_LocalNodeBackEnd() || net->is_LocalNodeFrontEnd()) {
        fprintf(stderr, "commnode: not an internal node by is_LocalNode*\n");
        return 2;
    }
    const char *mark = getenv("MRNET_TEST_COMMNODE_MARK");
    if (mark) {
        FILE *f = fopen(mark, "a");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
    }
    net->waitfor_ShutDown();
    delete net;
    return 0;
}
