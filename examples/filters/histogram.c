/*
 * histogram.c: a treecast plug-in filter in C that merges histograms.
 *
 * Parameters: "%ud", the number of bins. Every packet is "%auld", that many counts
 * (a back-end bins its own samples; each comm node adds its children's counts and
 * sends one histogram up). A packet with another number of bins is refused by its
 * rank, and the wave goes on without it. The state is the number of waves merged
 * here ("%uld"); set_params takes a new number of bins.
 *
 *   cc -shared -fPIC -I include -o libhistogram.so examples/filters/histogram.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "treecast_filter.h"
#include "treecast_filter_helpers.h"

typedef struct histogram {
    uint32_t bins;
    uint64_t waves;
} histogram;

static int32_t read_bins(const uint8_t *params, size_t len, uint32_t *bins, char *err, size_t err_len) {
    tc_reader r = tc_reader_of(params, len);
    if (tc_read_scalar(&r, TC_U32, bins) != 0 || r.left != 0 || *bins == 0) {
        tc_error(err, err_len, "histogram takes one parameter: the number of bins (%ud, at least 1)");
        return TREECAST_ERR_PARAMS;
    }
    return TREECAST_OK;
}

static int32_t create(const uint8_t *params, size_t params_len, const treecast_place *place, void **state,
                      char *err, size_t err_len) {
    (void)place;
    uint32_t bins;
    int32_t code = read_bins(params, params_len, &bins, err, err_len);
    if (code != TREECAST_OK) return code;
    histogram *h = (histogram *)calloc(1, sizeof *h);
    if (!h) {
        tc_error(err, err_len, "out of memory");
        return TREECAST_ERR_FILTER;
    }
    h->bins = bins;
    *state = h;
    return TREECAST_OK;
}

static int32_t reduce(void *state, const treecast_place *place, const treecast_packet *packets, size_t n,
                      const treecast_host *host, treecast_sink *sink, uint32_t *bad_rank, char *err,
                      size_t err_len) {
    (void)place;
    histogram *h = (histogram *)state;
    uint64_t *sum = (uint64_t *)calloc(h->bins, sizeof *sum);
    if (!sum) {
        tc_error(err, err_len, "out of memory");
        return TREECAST_ERR_FILTER;
    }
    for (size_t i = 0; i < n; i++) {
        tc_reader r = tc_reader_of(packets[i].payload, packets[i].payload_len);
        uint64_t count;
        const uint8_t *elems;
        if (tc_read_array(&r, TC_U64, &count, &elems) != 0 || r.left != 0 || count != h->bins) {
            char message[160];
            snprintf(message, sizeof message, "expected %u bins as \"%%auld\", got \"%s\"", h->bins,
                     packets[i].format);
            tc_error(err, err_len, message);
            *bad_rank = packets[i].rank;
            free(sum);
            return TREECAST_ERR_PACKET;
        }
        for (uint64_t b = 0; b < count; b++) {
            uint64_t v;
            memcpy(&v, elems + 8 * b, 8);
            sum[b] += v;
        }
    }
    h->waves++;
    tc_buf out = {0};
    tc_put_array(&out, TC_U64, h->bins, sum);
    free(sum);
    int32_t tag = n > 0 ? packets[0].tag : 0;
    int32_t code = out.failed ? -1 : host->emit(sink, TREECAST_UP, tag, out.data, out.len);
    tc_buf_free(&out);
    if (code != 0) {
        tc_error(err, err_len, "the node refused the merged histogram");
        return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}

static int32_t get_state(void *state, const treecast_host *host, treecast_sink *sink, char *err, size_t err_len) {
    histogram *h = (histogram *)state;
    tc_buf out = {0};
    tc_put_scalar(&out, TC_U64, &h->waves);
    int32_t code = out.failed ? -1 : host->emit(sink, TREECAST_STATE, 0, out.data, out.len);
    tc_buf_free(&out);
    if (code != 0) {
        tc_error(err, err_len, "the node refused the state");
        return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}

static int32_t set_params(void *state, const uint8_t *params, size_t params_len, char *err, size_t err_len) {
    uint32_t bins;
    int32_t code = read_bins(params, params_len, &bins, err, err_len);
    if (code == TREECAST_OK) ((histogram *)state)->bins = bins;
    return code;
}

static void destroy(void *state) { free(state); }

static const treecast_filter_table table = {
    TREECAST_FILTER_ABI_VERSION, sizeof(treecast_filter_table), "histogram", 1, 0, 0,
    create, reduce, get_state, set_params, destroy,
};

const treecast_filter_table *treecast_filter_v1(void) { return &table; }
