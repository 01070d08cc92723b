/* protocol.h: the tags the MRNet-style test programs share (tests/mrnet). */
#ifndef TESTS_MRNET_PROTOCOL_H
#define TESTS_MRNET_PROTOCOL_H

/* The C back-end (be_lightweight.c) takes the tags from the lightweight library's headers. */
#ifdef __cplusplus
#include "mrnet/Types.h"
#else
#include "mrnet_lightweight/Types.h"
#endif

enum {
    TAG_VALUE = FirstApplicationTag, /* "%d" x down; each back-end answers (rank + 1) * x */
    TAG_ECHO,                        /* back-ends answer rank + 1; the filter sends partial sums down */
    TAG_ECHO_DOWN,                   /* a partial sum a comm node's filter sent down; answered as TAG_ACK */
    TAG_ACK,
    TAG_TYPES,                       /* every format code, echoed back unchanged */
    TAG_DIE,                         /* the back-end ends without leaving */
    TAG_EXIT,
    TAG_SEND_EXIT                    /* "%d" n: the back-end sends 0 .. n-1, flushing each, then calls exit() */
};

/* Every format code, in the order TAG_TYPES packs them. */
#define TYPES_FORMAT "%c %uc %hd %uhd %d %ud %ld %uld %f %lf %s %ad %aud %alf %as %Ald %Ac"

#endif
