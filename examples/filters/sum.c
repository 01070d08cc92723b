/*
 * sum.c: the plug-in filter "plugin_sum" in C: adds "%d" packets, as the built-in sum
 * does for that format: what `treecast bench filter` measures against the built-in.
 *
 *   cc -O2 -shared -fPIC -I include -o libsum.so examples/filters/sum.c
 *   treecast bench filter --local 16 ./libsum.so:plugin_sum
 */
#include <stdio.h>

#include "treecast_filter.h"
#include "treecast_filter_helpers.h"

static int32_t create(const uint8_t *params, size_t params_len, const treecast_place *place, void **state,
                      char *err, size_t err_len) {
    (void)params;
    (void)place;
    if (params_len != 0) {
        tc_error(err, err_len, "plugin_sum takes no parameters");
        return TREECAST_ERR_PARAMS;
    }
    *state = NULL;
    return TREECAST_OK;
}

static int32_t reduce(void *state, const treecast_place *place, const treecast_packet *packets, size_t n,
                      const treecast_host *host, treecast_sink *sink, uint32_t *bad_rank, char *err,
                      size_t err_len) {
    (void)state;
    (void)place;
    int32_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        tc_reader r = tc_reader_of(packets[i].payload, packets[i].payload_len);
        int32_t v;
        if (tc_read_scalar(&r, TC_I32, &v) != 0 || r.left != 0) {
            char message[96];
            snprintf(message, sizeof message, "expected \"%%d\", got \"%s\"", packets[i].format);
            tc_error(err, err_len, message);
            *bad_rank = packets[i].rank;
            return TREECAST_ERR_PACKET;
        }
        /* Wraps around, as the built-in sum's integers do. */
        sum = (int32_t)((uint32_t)sum + (uint32_t)v);
    }
    uint8_t out[5];
    out[0] = TC_I32;
    memcpy(out + 1, &sum, 4);
    if (host->emit(sink, TREECAST_UP, n > 0 ? packets[0].tag : 0, out, sizeof out) != 0) {
        tc_error(err, err_len, "the node refused the sum");
        return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}

static const treecast_filter_table table = {
    TREECAST_FILTER_ABI_VERSION, sizeof(treecast_filter_table), "plugin_sum", 1, 0, 0,
    create, reduce, tc_no_state, tc_no_params, tc_no_destroy,
};

const treecast_filter_table *treecast_filter_v1(void) { return &table; }
