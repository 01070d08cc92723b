/*
 * treecast_filter_helpers.h: header-only helpers for C plug-in filters: read typed
 * values from a packet's payload and write them into a buffer to emit
 * (docs/wire-format.md, "Data payloads: typed values"). Little-endian hosts.
 *
 *   tc_reader r = tc_reader_of(packet->payload, packet->payload_len);
 *   uint64_t n; const uint8_t *elems;
 *   if (tc_read_array(&r, TC_U64, &n, &elems) != 0) ...   // %auld
 *   tc_buf out = {0};
 *   tc_put_array(&out, TC_U64, n, counts);
 *   host->emit(sink, TREECAST_UP, tag, out.data, out.len);
 *   tc_buf_free(&out);
 */
#ifndef TREECAST_FILTER_HELPERS_H
#define TREECAST_FILTER_HELPERS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "treecast_filter.h"

/* Scalar type codes (an array's code is 0x40 | the scalar's). */
enum {
    TC_I8 = 0x01, TC_U8 = 0x02, TC_I16 = 0x03, TC_U16 = 0x04, TC_I32 = 0x05, TC_U32 = 0x06,
    TC_I64 = 0x07, TC_U64 = 0x08, TC_F32 = 0x09, TC_F64 = 0x0a, TC_STR = 0x0b, TC_BYTES = 0x20,
    TC_ARRAY = 0x40
};

/* Width in bytes of a fixed-width scalar type, 0 for the others. */
static inline size_t tc_width(uint8_t code) {
    switch (code) {
    case TC_I8: case TC_U8: return 1;
    case TC_I16: case TC_U16: return 2;
    case TC_I32: case TC_U32: case TC_F32: return 4;
    case TC_I64: case TC_U64: case TC_F64: return 8;
    default: return 0;
    }
}

/* A cursor over a payload. */
typedef struct tc_reader {
    const uint8_t *p;
    size_t left;
} tc_reader;

static inline tc_reader tc_reader_of(const uint8_t *payload, size_t len) {
    tc_reader r = {payload, len};
    return r;
}

/* Reads a scalar of fixed-width type `code` into `out` (tc_width(code) bytes). 0 on success. */
static inline int tc_read_scalar(tc_reader *r, uint8_t code, void *out) {
    size_t w = tc_width(code);
    if (w == 0 || r->left < 1 + w || r->p[0] != code) return -1;
    memcpy(out, r->p + 1, w);
    r->p += 1 + w;
    r->left -= 1 + w;
    return 0;
}

/* Reads an array of fixed-width elements of type `code`: *n elements at *elems (unaligned,
 * valid as long as the payload). 0 on success. */
static inline int tc_read_array(tc_reader *r, uint8_t code, uint64_t *n, const uint8_t **elems) {
    size_t w = tc_width(code);
    uint32_t count;
    if (w == 0 || r->left < 5 || r->p[0] != (TC_ARRAY | code)) return -1;
    memcpy(&count, r->p + 1, 4);
    if ((uint64_t)(r->left - 5) < (uint64_t)count * w) return -1;
    *n = count;
    *elems = r->p + 5;
    r->p += 5 + (size_t)count * w;
    r->left -= 5 + (size_t)count * w;
    return 0;
}

/* Reads raw bytes (%b): *n bytes at *data, valid as long as the payload. 0 on success. */
static inline int tc_read_bytes(tc_reader *r, uint64_t *n, const uint8_t **data) {
    uint32_t len;
    if (r->left < 5 || r->p[0] != TC_BYTES) return -1;
    memcpy(&len, r->p + 1, 4);
    if ((uint64_t)(r->left - 5) < len) return -1;
    *n = len;
    *data = r->p + 5;
    r->p += 5 + (size_t)len;
    r->left -= 5 + (size_t)len;
    return 0;
}

/* A growing output buffer; zero-initialize it, free it with tc_buf_free. */
typedef struct tc_buf {
    uint8_t *data;
    size_t len, cap;
    int failed; /* set when memory ran out: do not emit the buffer */
} tc_buf;

static inline void tc_put_raw(tc_buf *b, const void *bytes, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->len + n) cap *= 2;
        uint8_t *grown = (uint8_t *)realloc(b->data, cap);
        if (!grown) { b->failed = 1; return; }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, bytes, n);
    b->len += n;
}

/* Appends a scalar of fixed-width type `code` whose bytes are at `value`. */
static inline void tc_put_scalar(tc_buf *b, uint8_t code, const void *value) {
    tc_put_raw(b, &code, 1);
    tc_put_raw(b, value, tc_width(code));
}

/* Appends an array of n fixed-width elements of type `code`. */
static inline void tc_put_array(tc_buf *b, uint8_t code, uint32_t n, const void *elems) {
    uint8_t c = (uint8_t)(TC_ARRAY | code);
    tc_put_raw(b, &c, 1);
    tc_put_raw(b, &n, 4);
    tc_put_raw(b, elems, (size_t)n * tc_width(code));
}

static inline void tc_buf_free(tc_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* Writes a message into a filter function's error buffer. */
static inline void tc_error(char *err, size_t err_len, const char *message) {
    if (!err || err_len == 0) return;
    size_t n = strlen(message);
    if (n >= err_len) n = err_len - 1;
    memcpy(err, message, n);
    err[n] = 0;
}

/* For a filter with no state to report: its get_state reports nothing. */
static inline int32_t tc_no_state(void *state, const treecast_host *host, treecast_sink *sink, char *err,
                                  size_t err_len) {
    (void)state;
    (void)host;
    (void)sink;
    (void)err;
    (void)err_len;
    return TREECAST_OK;
}

/* For a filter that takes no parameters: its set_params refuses any. */
static inline int32_t tc_no_params(void *state, const uint8_t *params, size_t params_len, char *err,
                                   size_t err_len) {
    (void)state;
    (void)params;
    (void)params_len;
    tc_error(err, err_len, "this filter takes no parameters");
    return TREECAST_ERR_PARAMS;
}

/* For a filter that keeps nothing: its destroy frees nothing. */
static inline void tc_no_destroy(void *state) { (void)state; }

#endif /* TREECAST_FILTER_HELPERS_H */
