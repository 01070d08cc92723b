/* be_lightweight.c: be.cpp in C, on MRNet's lightweight back-end library: answers the
 * front-end's requests (protocol.h) on whichever stream they came, so fe.cpp runs the
 * same test over C back-ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mrnet_lightweight/MRNet.h"
#include "xplat_lightweight/NetUtils.h"
#include "protocol.h"

/* Every format code, unpacked, then sent back as it came; 0 on success. */
static int echo_types(Stream_t *s, Packet_t *p, int tag) {
    char c, *str, **as, *Ac;
    unsigned char uc;
    int16_t hd;
    uint16_t uhd;
    int32_t d, *ad;
    uint32_t ud, *aud, n_ad, n_aud, n_alf, n_as, i;
    int64_t ld, *Ald;
    uint64_t uld, n_Ald, n_Ac;
    float f;
    double lf, *alf;
    if (Packet_unpack(p, TYPES_FORMAT, &c, &uc, &hd, &uhd, &d, &ud, &ld, &uld, &f, &lf, &str, &ad, &n_ad, &aud,
                      &n_aud, &alf, &n_alf, &as, &n_as, &Ald, &n_Ald, &Ac, &n_Ac) != 0) {
        fprintf(stderr, "be_lightweight: unpack of every type failed\n");
        return 4;
    }
    /* the same values again, through a packet of its own */
    Packet_t *out = new_Packet_t_2(Stream_get_Id(s), 0, TYPES_FORMAT, c, uc, hd, uhd, d, ud, ld, uld, f, lf, str, ad,
                                   n_ad, aud, n_aud, alf, n_alf, as, n_as, Ald, n_Ald, Ac, n_Ac);
    if (!out || strcmp(Packet_get_FormatString(out), TYPES_FORMAT) != 0) {
        fprintf(stderr, "be_lightweight: new_Packet_t_2 of every type failed\n");
        return 4;
    }
    Packet_set_Tag(out, tag);
    int rc = Stream_send_packet(s, out); /* frees `out` once sent */
    if (rc != 0) delete_Packet_t(out);
    free(str);
    free(ad);
    free(aud);
    free(alf);
    for (i = 0; i < n_as; i++) free(as[i]);
    free(as);
    free(Ald);
    free(Ac);
    return rc == 0 ? 0 : 4;
}

/* Sends 0 .. n-1, flushing each, forking a child that exits halfway, then exits. */
static int send_then_exit(Stream_t *s, int tag, int n) {
    int i;
    for (i = 0; i < n; i++) {
        if (Stream_send(s, tag, "%d", i) != 0 || Stream_flush(s) != 0) return 9;
        if (i != n / 2) continue;
        pid_t child = fork();
        if (child == 0) exit(0);
        int status = 0, waited = 0;
        while (child > 0 && waitpid(child, &status, WNOHANG) == 0 && waited++ < 1000) usleep(10000);
        if (child < 0 || waited > 1000) {
            fprintf(stderr, "be_lightweight: a forked child's exit() hung\n");
            return 10;
        }
    }
    exit(0);
}

/* Adds `s` to the streams seen; 0 when there are too many to track. */
static int remember(Stream_t **seen, int *n, Stream_t *s) {
    int i;
    for (i = 0; i < *n; i++)
        if (seen[i] == s) return 1;
    if (*n == 64) {
        fprintf(stderr, "be_lightweight: more than 64 streams\n");
        return 0;
    }
    seen[(*n)++] = s;
    return 1;
}

/* How many of the streams seen the front-end closed; a blocking receive on each of
 * them must end at once. 0 on success. */
static int count_closed(Stream_t **seen, int n, int *closed) {
    int i, t = 0;
    Packet_t none;
    *closed = 0;
    for (i = 0; i < n; i++) {
        if (!Stream_is_Closed(seen[i])) continue;
        (*closed)++;
        if (Stream_recv(seen[i], &t, &none, true) != -1) {
            fprintf(stderr, "be_lightweight: Stream_recv on a closed stream did not return -1\n");
            return 7;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    Network_t *net = Network_CreateNetworkBE(argc, argv);
    if (!net) return 1;
    char host[XPLAT_MAX_HOSTNAME_LEN];
    if (!Network_is_LocalNodeBackEnd(net) || XPlat_NetUtils_GetLocalHostName(host) != 0 ||
        strcmp(host, Network_get_LocalHostName(net)) != 0) {
        fprintf(stderr, "be_lightweight: not a back-end, or not on this host by name\n");
        return 1;
    }
    int rank = (int)Network_get_LocalRank(net);
    /* MRNet's arguments last: parent host, port, rank, own host, own rank */
    if (argc != 6 || atoi(argv[5]) != rank) {
        fprintf(stderr, "be_lightweight: not started with MRNet's five arguments ending in rank %d\n", rank);
        return 1;
    }
    /* the streams packets came on: closings are no packets here, Stream_is_Closed tells */
    Stream_t *seen[64];
    int n_seen = 0;
    /* as MRNet's programs do: one packet, allocated once, received into again and again */
    Packet_t *p = (Packet_t *)malloc(sizeof(Packet_t));
    bool_t done = false;
    while (!done) {
        int tag = 0, x = 0, rc;
        Stream_t *s = NULL;
        rc = Network_recv(net, &tag, p, &s);
        if (rc != 1) break; /* blocking: a packet, or the end */
        if (!remember(seen, &n_seen, s)) return 12;
        if (Packet_get_Tag(p) != tag || Packet_get_StreamId(p) != Stream_get_Id(s) ||
            Network_get_Stream(net, Stream_get_Id(s)) != s) {
            fprintf(stderr, "be_lightweight: the packet's tag or stream does not match Network_recv's\n");
            return 11;
        }
        switch (tag) {
        case TAG_VALUE:
            if (Packet_unpack(p, "%d", &x) != 0) return 2;
            Stream_send(s, tag, "%d", (rank + 1) * x);
            break;
        case TAG_ECHO:
            Stream_send(s, tag, "%d", rank + 1);
            break;
        case TAG_ECHO_DOWN:
            if (Packet_unpack(p, "%d", &x) != 0) return 3;
            Stream_send(s, TAG_ACK, "%d", x);
            break;
        case TAG_TYPES:
            if ((rc = echo_types(s, p, tag)) != 0) return rc;
            break;
        case TAG_DIE:
            _exit(0);
        case TAG_SEND_EXIT:
            if (Packet_unpack(p, "%d", &x) != 0) return 8;
            return send_then_exit(s, tag, x);
        case TAG_EXIT:
            if ((rc = count_closed(seen, n_seen, &x)) != 0) return rc;
            Stream_send(s, tag, "%d", x);
            done = true;
            break;
        default:
            fprintf(stderr, "be_lightweight: unknown tag %d\n", tag);
            return 5;
        }
        if (Stream_flush(s) != 0) {
            fprintf(stderr, "be_lightweight: Stream_flush failed\n");
            return 6;
        }
    }
    delete_Packet_t(p);
    Network_waitfor_ShutDown(net);
    delete_Network_t(net);
    return 0;
}
