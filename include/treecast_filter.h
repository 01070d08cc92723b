/*
 * treecast_filter.h: the C ABI of treecast plug-in filters, version 1.
 *
 * A plug-in is a shared object that exports one function, TREECAST_FILTER_SYMBOL
 * ("treecast_filter_v1"), returning a pointer to a static treecast_filter_table.
 * The host checks the table's abi_version and size before it reads anything else,
 * so a plug-in built against another version of this header is refused with a
 * clear error. docs/filter-abi.md is the reference; this header is its C form.
 *
 * Every function returns TREECAST_OK (0) or an error code, and on error writes a
 * NUL-terminated message of at most err_len bytes into err. Functions are called
 * from one thread at a time per filter instance; different instances (streams)
 * may be called from different threads.
 */
#ifndef TREECAST_FILTER_H
#define TREECAST_FILTER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the table layout this header describes. */
#define TREECAST_FILTER_ABI_VERSION 1u
/* The name of the one symbol a plug-in exports. */
#define TREECAST_FILTER_SYMBOL "treecast_filter_v1"

/* Return codes. */
#define TREECAST_OK 0
/* The filter failed (the message says why); the wave's output is dropped. */
#define TREECAST_ERR_FILTER 1
/* A packet is at fault: *bad_rank names its source rank, the host drops that
 * rank's packets and calls reduce again with the rest of the wave. */
#define TREECAST_ERR_PACKET 2
/* The parameters are refused (create, set_params). */
#define TREECAST_ERR_PARAMS 3

/* Where a filter instance runs (treecast_place.role). */
#define TREECAST_ROLE_FRONT_END 0u
#define TREECAST_ROLE_COMM_NODE 1u
#define TREECAST_ROLE_BACK_END 2u

/* Where an emitted packet goes (treecast_host.emit). */
#define TREECAST_UP 0u
#define TREECAST_DOWN 1u
/* Only from get_state: the instance's state, as one opaque byte string. */
#define TREECAST_STATE 2u

/* What a filter instance is told about where it runs. */
typedef struct treecast_place {
    uint32_t stream;   /* the stream's id */
    uint32_t rank;     /* the node's id in the tree (pre-order; 0 is the front-end) */
    uint32_t role;     /* TREECAST_ROLE_* */
    uint32_t children; /* children of this node that are members of the stream */
    uint32_t depth;    /* the node's depth (0 at the front-end) */
    uint32_t leaves;   /* back-end ranks of the stream below this node */
} treecast_place;

/* One packet of a wave, valid during the call only. */
typedef struct treecast_packet {
    int32_t tag;            /* the sender's tag */
    uint32_t rank;          /* the source rank (the lowest of a reduced packet) */
    const char *format;     /* the payload's format string, NUL-terminated, e.g. "%d %aud" */
    const uint8_t *payload; /* typed values as docs/wire-format.md defines them */
    size_t payload_len;
} treecast_packet;

/* The host's side of one call: opaque to the plug-in. */
typedef struct treecast_sink treecast_sink;

/* Functions the host lends the plug-in during reduce and get_state. */
typedef struct treecast_host {
    uint32_t size; /* sizeof(treecast_host) as the host knows it */
    /* Emits one packet (TREECAST_UP or TREECAST_DOWN, with the plug-in's tag) or the
     * state (TREECAST_STATE, tag ignored). The payload is copied and checked: bytes
     * that are not typed values are refused with a non-zero return. */
    int32_t (*emit)(treecast_sink *sink, uint32_t direction, int32_t tag, const uint8_t *payload,
                    size_t payload_len);
} treecast_host;

/* The table a plug-in exports. Layout fixed for abi_version 1; fields only grow at the end. */
typedef struct treecast_filter_table {
    uint32_t abi_version; /* TREECAST_FILTER_ABI_VERSION */
    uint32_t size;        /* sizeof(treecast_filter_table) */
    const char *name;     /* the filter's name on the wire, NUL-terminated UTF-8, 1 to 256 bytes */
    uint16_t version;     /* the filter's own version (what streams ask for) */
    uint16_t reserved;    /* 0 */
    uint32_t reserved2;   /* 0 */
    /* Makes one instance for one stream on one node; *state is the plug-in's. */
    int32_t (*create)(const uint8_t *params, size_t params_len, const treecast_place *place, void **state,
                      char *err, size_t err_len);
    /* Reduces one wave: n packets in child order; emits what goes up and down. */
    int32_t (*reduce)(void *state, const treecast_place *place, const treecast_packet *packets, size_t n,
                      const treecast_host *host, treecast_sink *sink, uint32_t *bad_rank, char *err,
                      size_t err_len);
    /* Emits the instance's state (TREECAST_STATE) for recovery; may emit nothing. */
    int32_t (*get_state)(void *state, const treecast_host *host, treecast_sink *sink, char *err, size_t err_len);
    /* New parameters while the stream runs. */
    int32_t (*set_params)(void *state, const uint8_t *params, size_t params_len, char *err, size_t err_len);
    /* Ends the instance (the stream closed on this node). */
    void (*destroy)(void *state);
    /* Optional (may be NULL; absent from tables built before it was added, whose size
     * is offsetof(treecast_filter_table, adopt_state), and which still load): takes
     * over a state that get_state of a lost instance of this filter reported, when
     * the lost node's children rejoin this node, so a running reduction stays correct.
     * Without it such a state is dropped and the front-end gets a filter error. */
    int32_t (*adopt_state)(void *state, const uint8_t *bytes, size_t len, char *err, size_t err_len);
} treecast_filter_table;

/* The symbol's type: returns the plug-in's static table. */
typedef const treecast_filter_table *(*treecast_filter_entry)(void);

/* What a plug-in defines (exported with default visibility). */
const treecast_filter_table *treecast_filter_v1(void);

#ifdef __cplusplus
}
#endif

#endif /* TREECAST_FILTER_H */
