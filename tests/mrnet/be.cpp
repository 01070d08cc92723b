/* be.cpp: the back-end of the MRNet-style test (tests/mrnet): answers the front-end's
 * requests (protocol.h) on whichever stream they came. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mrnet/MRNet.h"
#include "protocol.h"

using namespace MRN;

int main(int argc, char **argv) {
    Network *net = Network::CreateNetworkBE(argc, argv);
    if (net->has_Error()) {
        net->perror("be: CreateNetworkBE");
        return 1;
    }
    if (!net->is_LocalNodeBackEnd() || net->is_LocalNodeFrontEnd() || net->is_LocalNodeInternal()) {
        fprintf(stderr, "be: not a back-end by is_LocalNode*\n");
        return 1;
    }
    int rank = (int)net->get_LocalRank();
    /* MRNet's arguments last: parent host, port, rank, own host, own rank */
    if (argc != 6 || atoi(argv[5]) != rank) {
        fprintf(stderr, "be: not started with MRNet's five arguments ending in rank %d (%d arguments)\n", rank,
                argc - 1);
        return 1;
    }
    int closed = 0; /* streams the front-end closed, as recv told */
    bool done = false;
    while (!done) {
        int tag = 0;
        PacketPtr p;
        Stream *s = NULL;
        int rc = net->recv(&tag, p, &s);
        if (rc == 0) { /* a stream closed */
            if (s && s->is_Closed()) {
                closed++;
                /* its closing was taken: a blocking receive on it ends, it does not wait */
                PacketPtr none;
                int t = 0;
                if (s->recv(&t, none, true) != -1) {
                    fprintf(stderr, "be: Stream::recv on a closed stream did not return -1\n");
                    return 7;
                }
            }
            continue;
        }
        if (rc < 0) break;
        int x = 0;
        switch (tag) {
        case TAG_VALUE:
            if (p->unpack("%d", &x) != 0) return 2;
            s->send(tag, "%d", (rank + 1) * x);
            break;
        case TAG_ECHO:
            s->send(tag, "%d", rank + 1);
            break;
        case TAG_ECHO_DOWN:
            if (p->unpack("%d", &x) != 0) return 3;
            s->send(TAG_ACK, "%d", x);
            break;
        case TAG_TYPES: {
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
            int32_t *ad;
            uint32_t *aud, n_ad, n_aud, n_alf, n_as;
            double *alf;
            char **as;
            int64_t *Ald;
            char *Ac;
            uint64_t n_Ald, n_Ac;
            if (p->unpack(TYPES_FORMAT, &c, &uc, &hd, &uhd, &d, &ud, &ld, &uld, &f, &lf, &str, &ad, &n_ad, &aud,
                          &n_aud, &alf, &n_alf, &as, &n_as, &Ald, &n_Ald, &Ac, &n_Ac) != 0) {
                fprintf(stderr, "be: unpack of every type failed\n");
                return 4;
            }
            s->send(tag, TYPES_FORMAT, c, uc, hd, uhd, d, ud, ld, uld, f, lf, str, ad, n_ad, aud, n_aud, alf, n_alf,
                    as, n_as, Ald, n_Ald, Ac, n_Ac);
            free(str);
            free(ad);
            free(aud);
            free(alf);
            for (uint32_t i = 0; i < n_as; i++) free(as[i]);
            free(as);
            free(Ald);
            free(Ac);
            break;
        }
        case TAG_DIE:
            _exit(0);
        case TAG_SEND_EXIT: {
            /* MRNet's flush returns before the write; exit() without deleting the
             * Network still writes it all (the layer drains at exit). Halfway, a
             * forked child exits: it inherits the drain but not treecast's threads,
             * and must neither wait on them nor write what its parent queued. */
            if (p->unpack("%d", &x) != 0) return 8;
            for (int i = 0; i < x; i++) {
                if (s->send(tag, "%d", i) != 0 || s->flush() != 0) return 9;
                if (i != x / 2) continue;
                pid_t child = fork();
                if (child == 0) exit(0);
                int status = 0, waited = 0;
                while (child > 0 && waitpid(child, &status, WNOHANG) == 0 && waited++ < 1000) usleep(10000);
                if (child < 0 || waited > 1000) {
                    fprintf(stderr, "be: a forked child's exit() hung\n");
                    return 10;
                }
            }
            exit(0);
        }
        case TAG_EXIT:
            s->send(tag, "%d", closed);
            done = true;
            break;
        default:
            fprintf(stderr, "be: unknown tag %d\n", tag);
            return 5;
        }
        if (s->flush() != 0) {
            fprintf(stderr, "be: Stream::flush failed\n");
            return 6;
        }
    }
    net->waitfor_ShutDown();
    delete net;
    return 0;
}
