/*
 * running_total.c: the plug-in filter "running_total": the total of every value the
 * back-ends ever sent on the stream, across waves, with its state taken over after a
 * recovery.
 *
 * A back-end sends "%d" (this wave's value). Each node keeps the sum of the "%d"
 * values it took in itself (its state), and sends up "%ld": that sum plus the "%ld"
 * totals its comm-node children sent this wave. When a comm node is lost, its parent
 * takes over its last reported state (adopt_state) as its back-ends rejoin the parent,
 * so the totals after the rejoin are what they would have been without the loss.
 *
 *   cc -shared -fPIC -I include -o librunning_total.so examples/filters/running_total.c
 */
#include <stdio.h>
#include <stdlib.h>

#include "treecast_filter.h"
#include "treecast_filter_helpers.h"

static int32_t create(const uint8_t *params, size_t params_len, const treecast_place *place, void **state,
                      char *err, size_t err_len) {
    (void)params;
    (void)place;
    if (params_len != 0) {
        tc_error(err, err_len, "running_total takes no parameters");
        return TREECAST_ERR_PARAMS;
    }
    int64_t *own = calloc(1, sizeof *own);
    if (own == NULL) {
        tc_error(err, err_len, "out of memory");
        return TREECAST_ERR_FILTER;
    }
    *state = own;
    return TREECAST_OK;
}

/* Reads one value of type `code` and nothing else. */
static int read_one(const treecast_packet *p, uint8_t code, void *out) {
    tc_reader r = tc_reader_of(p->payload, p->payload_len);
    return tc_read_scalar(&r, code, out) == 0 && r.left == 0 ? 0 : -1;
}

static int32_t reduce(void *state, const treecast_place *place, const treecast_packet *packets, size_t n,
                      const treecast_host *host, treecast_sink *sink, uint32_t *bad_rank, char *err,
                      size_t err_len) {
    (void)place;
    int64_t *own = state;
    int64_t taken = 0, below = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t value;
        int64_t total;
        if (read_one(&packets[i], TC_I32, &value) == 0) {
            taken += value;
        } else if (read_one(&packets[i], TC_I64, &total) == 0) {
            below += total;
        } else {
            char message[96];
            snprintf(message, sizeof message, "expected \"%%d\" or \"%%ld\", got \"%s\"", packets[i].format);
            tc_error(err, err_len, message);
            *bad_rank = packets[i].rank;
            return TREECAST_ERR_PACKET;
        }
    }
    *own += taken;
    int64_t total = *own + below;
    uint8_t out[9];
    out[0] = TC_I64;
    memcpy(out + 1, &total, 8);
    if (host->emit(sink, TREECAST_UP, n > 0 ? packets[0].tag : 0, out, sizeof out) != 0) {
        tc_error(err, err_len, "the node refused the total");
        return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}

/* The state: "%ld", the sum of the values this instance took in itself. */
static int32_t get_state(void *state, const treecast_host *host, treecast_sink *sink, char *err,
                         size_t err_len) {
    uint8_t out[9];
    out[0] = TC_I64;
    memcpy(out + 1, state, 8);
    if (host->emit(sink, TREECAST_STATE, 0, out, sizeof out) != 0) {
        tc_error(err, err_len, "the node refused the state");
        return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}

/* A lost instance's values become this one's own: its back-ends now send here. */
static int32_t adopt_state(void *state, const uint8_t *bytes, size_t len, char *err, size_t err_len) {
    tc_reader r = tc_reader_of(bytes, len);
    int64_t lost;
    if (tc_read_scalar(&r, TC_I64, &lost) != 0 || r.left != 0) {
        tc_error(err, err_len, "a running_total state is one \"%ld\"");
        return TREECAST_ERR_FILTER;
    }
    *(int64_t *)state += lost;
    return TREECAST_OK;
}

static void destroy(void *state) { free(state); }

static const treecast_filter_table table = {
    TREECAST_FILTER_ABI_VERSION, sizeof(treecast_filter_table), "running_total", 1, 0, 0,
    create, reduce, get_state, tc_no_params, destroy, adopt_state,
};

const treecast_filter_table *treecast_filter_v1(void) { return &table; }
