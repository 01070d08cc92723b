/* packet.cpp: packets, their values, format strings and treecast's typed-value
 * payloads; shared by libmrnet and the filter adapter plug-in. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "internal.h"
#include "mrnet/Error.h"
#include "mrnet/Event.h"
#include "mrnet/FilterIds.h"
#include "mrnet/Packet.h"

namespace MRN {

/* ---- globals of the interface ---- */

const int MIN_OUTPUT_LEVEL = 0;
const int MAX_OUTPUT_LEVEL = 5;
int CUR_OUTPUT_LEVEL = 1;
char *MRN_DEBUG_LOG_DIRECTORY = NULL;
const Port UnknownPort = (Port)-1;
const Rank UnknownRank = (Rank)-1;

void get_Version(int &major, int &minor, int &revision) {
    major = MRNET_VERSION_MAJOR;
    minor = MRNET_VERSION_MINOR;
    revision = MRNET_VERSION_REV;
}

void set_OutputLevel(int l) {
    CUR_OUTPUT_LEVEL = l < MIN_OUTPUT_LEVEL ? MIN_OUTPUT_LEVEL : (l > MAX_OUTPUT_LEVEL ? MAX_OUTPUT_LEVEL : l);
}

static FILE *printf_out = NULL;
void mrn_printf_init(FILE *ifp) { printf_out = ifp; }

int mrn_printf(const char *file, int line, const char *func, FILE *fp, const char *format, ...) {
    FILE *out = fp ? fp : (printf_out ? printf_out : stderr);
    int n = fprintf(out, "%s:%d %s(): ", file ? file : "?", line, func ? func : "?");
    va_list ap;
    va_start(ap, format);
    n += vfprintf(out, format, ap);
    va_end(ap);
    return n;
}

/* Filter ids: the built-ins of treecast under MRNet's names; ids from 100 are loaded ones. */
FilterId TFILTER_NULL = 0;
FilterId TFILTER_SUM = 1;
FilterId TFILTER_AVG = 2;
FilterId TFILTER_MIN = 3;
FilterId TFILTER_MAX = 4;
FilterId TFILTER_ARRAY_CONCAT = 5;
FilterId TFILTER_INT_EQ_CLASS = 6;
FilterId TFILTER_EPK_UNIFY = 7;
FilterId TFILTER_PERFDATA = 8;
FilterId TFILTER_TOPO_UPDATE = 9;
FilterId TFILTER_TOPO_UPDATE_DOWNSTREAM = 10;
FilterId SFILTER_DONTWAIT = 11;
FilterId SFILTER_WAITFORALL = 12;
FilterId SFILTER_TIMEOUT = 13;

const EventClass Event::EVENT_CLASS_ALL = 0;
const EventClass Event::DATA_EVENT = 1;
const EventClass Event::TOPOLOGY_EVENT = 2;
const EventClass Event::ERROR_EVENT = 3;
EventType Event::EVENT_TYPE_ALL = 0;
EventType DataEvent::DATA_AVAILABLE = 1;
EventType TopologyEvent::TOPOL_ADD_BE = 2;
EventType TopologyEvent::TOPOL_ADD_CP = 3;
EventType TopologyEvent::TOPOL_REMOVE_NODE = 4;
EventType TopologyEvent::TOPOL_CHANGE_PARENT = 5;
EventType ErrorEvent::ERROR_INTERNAL = 6;
EventType ErrorEvent::ERROR_SYSTEM = 7;
EventType ErrorEvent::ERROR_USAGE = 8;

ErrorDef errors[] = {
    {ERR_NONE, ERR_INFO, ERR_IGNORE, "no error"},
    {ERR_TOPOLOGY_FORMAT, ERR_CRIT, ERR_ABORT, "topology file: bad format"},
    {ERR_TOPOLOGY_CYCLE, ERR_CRIT, ERR_ABORT, "topology file: the tree has a cycle"},
    {ERR_TOPOLOGY_NOTCONNECTED, ERR_CRIT, ERR_ABORT, "topology file: the tree is not connected"},
    {ERR_NETWORK_FAILURE, ERR_CRIT, ERR_ABORT, "network failure"},
    {ERR_FORMATSTR, ERR_ERR, ERR_ALERT, "bad format string"},
    {ERR_PACKING, ERR_ERR, ERR_ALERT, "values do not match the format string"},
    {ERR_INTERNAL, ERR_CRIT, ERR_ABORT, "internal failure"},
    {ERR_SYSTEM, ERR_CRIT, ERR_ABORT, "system call failure"},
    {ERR_CODE_LAST, ERR_ERR, ERR_ALERT, "unknown error"},
};

void Error::perror(const char *str) const {
    fprintf(stderr, "%s: %s%s%s\n", str ? str : "", get_ErrorStr(MRN_errno), MRN_errmsg[0] ? ": " : "",
            MRN_errmsg);
}

void Error::error(ErrorCode code, Rank, const char *fmt, ...) const {
    MRN_errno = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(MRN_errmsg, sizeof MRN_errmsg, fmt, ap);
    va_end(ap);
    if (CUR_OUTPUT_LEVEL >= 3) fprintf(stderr, "mrnet: %s: %s\n", get_ErrorStr(code), MRN_errmsg);
}

/* ---- types ---- */

namespace compat {

struct TypeInfo {
    DataType t;
    const char *mrnet; /* the specifier without '%' */
    uint32_t code;
    size_t size;
};

static const TypeInfo TYPES[] = {
    {CHAR_T, "c", 0x01, 1},           {UCHAR_T, "uc", 0x02, 1},         {INT16_T, "hd", 0x03, 2},
    {UINT16_T, "uhd", 0x04, 2},       {INT32_T, "d", 0x05, 4},          {UINT32_T, "ud", 0x06, 4},
    {INT64_T, "ld", 0x07, 8},         {UINT64_T, "uld", 0x08, 8},       {FLOAT_T, "f", 0x09, 4},
    {DOUBLE_T, "lf", 0x0a, 8},        {STRING_T, "s", 0x0b, 0},         {CHAR_ARRAY_T, "ac", 0x41, 1},
    {UCHAR_ARRAY_T, "auc", 0x42, 1},  {INT16_ARRAY_T, "ahd", 0x43, 2},  {UINT16_ARRAY_T, "auhd", 0x44, 2},
    {INT32_ARRAY_T, "ad", 0x45, 4},   {UINT32_ARRAY_T, "aud", 0x46, 4}, {INT64_ARRAY_T, "ald", 0x47, 8},
    {UINT64_ARRAY_T, "auld", 0x48, 8}, {FLOAT_ARRAY_T, "af", 0x49, 4},  {DOUBLE_ARRAY_T, "alf", 0x4a, 8},
    {STRING_ARRAY_T, "as", 0x4b, 0},  {CHAR_LRG_ARRAY_T, "Ac", 0x41, 1}, {UCHAR_LRG_ARRAY_T, "Auc", 0x42, 1},
    {INT16_LRG_ARRAY_T, "Ahd", 0x43, 2}, {UINT16_LRG_ARRAY_T, "Auhd", 0x44, 2},
    {INT32_LRG_ARRAY_T, "Ad", 0x45, 4}, {UINT32_LRG_ARRAY_T, "Aud", 0x46, 4},
    {INT64_LRG_ARRAY_T, "Ald", 0x47, 8}, {UINT64_LRG_ARRAY_T, "Auld", 0x48, 8},
    {FLOAT_LRG_ARRAY_T, "Af", 0x49, 4}, {DOUBLE_LRG_ARRAY_T, "Alf", 0x4a, 8},
    {STRING_LRG_ARRAY_T, "As", 0x4b, 0},
};
static const size_t NTYPES = sizeof TYPES / sizeof TYPES[0];

static const TypeInfo *info(DataType t) {
    for (size_t i = 0; i < NTYPES; i++)
        if (TYPES[i].t == t) return &TYPES[i];
    return NULL;
}

uint32_t tc_code(DataType t) {
    const TypeInfo *i = info(t);
    return i ? i->code : 0;
}

DataType from_tc_code(uint32_t code) {
    if (code == 0x20) return UCHAR_ARRAY_T; /* %b reads as bytes */
    for (size_t i = 0; i < NTYPES; i++)
        if (TYPES[i].code == code) return TYPES[i].t;
    return UNKNOWN_T;
}

size_t elem_size(DataType t) {
    const TypeInfo *i = info(t);
    return i ? i->size : 0;
}

bool is_array(DataType t) { return (tc_code(t) & 0x40) != 0; }

static bool is_large(DataType t) {
    const TypeInfo *i = info(t);
    return i && i->mrnet[0] == 'A';
}

const char *tc_spec(DataType t) {
    static const char *const SPECS[] = {"",    "%c",  "%uc", "%hd", "%uhd", "%d",  "%ud",
                                        "%ld", "%uld", "%f", "%lf", "%s"};
    uint32_t c = tc_code(t);
    static const char *const ARRAYS[] = {"",     "%ac", "%auc", "%ahd", "%auhd", "%ad", "%aud",
                                         "%ald", "%auld", "%af", "%alf", "%as"};
    if (c & 0x40) return ARRAYS[c & 0x0f];
    return c <= 0x0b ? SPECS[c] : "";
}

std::string tc_format(const Packet &p) {
    std::string f;
    for (unsigned int i = 0; i < p.get_NumDataElements(); i++) {
        if (i) f += ' ';
        f += tc_spec(p[i]->get_Type());
    }
    return f;
}

/* The specifiers of a format string ("%d %as" or "%d%as"), without '%'. */
static bool tokens(const char *fmt, std::vector<std::string> &out) {
    if (!fmt) return false;
    std::string cur;
    for (const char *c = fmt;; c++) {
        if (*c == '%' || *c == ' ' || *c == '\t' || *c == '\n' || *c == 0) {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
            if (*c == 0) break;
        } else {
            cur += *c;
        }
    }
    return true;
}

}  // namespace compat

using namespace compat;

bool compat::is_large_array(DataType t) { return is_large(t); }

bool compat::format_types(const char *fmt, std::vector<DataType> &out) {
    std::vector<std::string> toks;
    if (!tokens(fmt, toks)) return false;
    for (size_t i = 0; i < toks.size(); i++) {
        DataType t = Fmt2Type(toks[i].c_str());
        if (t == UNKNOWN_T) return false;
        out.push_back(t);
    }
    return true;
}

DataType Fmt2Type(const char *cur_fmt) {
    if (!cur_fmt) return UNKNOWN_T;
    if (*cur_fmt == '%') cur_fmt++;
    for (size_t i = 0; i < NTYPES; i++)
        if (strcmp(TYPES[i].mrnet, cur_fmt) == 0) return TYPES[i].t;
    return UNKNOWN_T;
}

/* ---- DataElement ---- */

DataElement::DataElement(void) : type(UNKNOWN_T), array_len(0), destroy_data(true) { val.uld = 0; }
DataElement::~DataElement() { release(); }

void DataElement::release(void) {
    if (!destroy_data) return;
    if (type == STRING_T) {
        free(val.p);
    } else if (type == STRING_ARRAY_T || type == STRING_LRG_ARRAY_T) {
        char **s = (char **)val.p;
        for (uint64_t i = 0; s && i < array_len; i++) free(s[i]);
        free(s);
    } else if (is_array(type)) {
        free(val.p);
    }
    val.uld = 0;
    array_len = 0;
}

void DataElement::set_DestroyData(bool d) { destroy_data = d; }
DataType DataElement::get_Type(void) const { return type; }
char DataElement::get_char(void) const { return val.c; }
void DataElement::set_char(char c) { release(); type = CHAR_T; val.c = c; }
unsigned char DataElement::get_uchar(void) const { return val.uc; }
void DataElement::set_uchar(unsigned char uc) { release(); type = UCHAR_T; val.uc = uc; }
int16_t DataElement::get_int16_t(void) const { return val.hd; }
void DataElement::set_int16_t(int16_t hd) { release(); type = INT16_T; val.hd = hd; }
uint16_t DataElement::get_uint16_t(void) const { return val.uhd; }
void DataElement::set_uint16_t(uint16_t uhd) { release(); type = UINT16_T; val.uhd = uhd; }
int32_t DataElement::get_int32_t(void) const { return val.d; }
void DataElement::set_int32_t(int32_t d) { release(); type = INT32_T; val.d = d; }
uint32_t DataElement::get_uint32_t(void) const { return val.ud; }
void DataElement::set_uint32_t(uint32_t ud) { release(); type = UINT32_T; val.ud = ud; }
int64_t DataElement::get_int64_t(void) const { return val.ld; }
void DataElement::set_int64_t(int64_t ld) { release(); type = INT64_T; val.ld = ld; }
uint64_t DataElement::get_uint64_t(void) const { return val.uld; }
void DataElement::set_uint64_t(uint64_t uld) { release(); type = UINT64_T; val.uld = uld; }
float DataElement::get_float(void) const { return val.f; }
void DataElement::set_float(float f) { release(); type = FLOAT_T; val.f = f; }
double DataElement::get_double(void) const { return val.lf; }
void DataElement::set_double(double lf) { release(); type = DOUBLE_T; val.lf = lf; }
const char *DataElement::get_string(void) const { return type == STRING_T ? (const char *)val.p : NULL; }

void DataElement::set_string(const char *p) {
    release();
    type = STRING_T;
    val.p = strdup(p ? p : "");
}

const void *DataElement::get_array(DataType *t, uint64_t *len) const {
    if (t) *t = type;
    if (len) *len = array_len;
    return is_array(type) ? val.p : NULL;
}

const void *DataElement::get_array(DataType *t, uint32_t *len) const {
    if (t) *t = type;
    if (len) *len = (uint32_t)array_len;
    return is_array(type) ? val.p : NULL;
}

void DataElement::set_array(const void *p, DataType t, uint64_t len) {
    release();
    type = t;
    array_len = len;
    if (!is_array(t)) { /* no array type (a kind this layer does not know): no data, so no leak */
        array_len = 0;
        val.p = NULL;
        return;
    }
    if (t == STRING_ARRAY_T || t == STRING_LRG_ARRAY_T) {
        char **out = (char **)calloc(len ? len : 1, sizeof(char *));
        const char *const *in = (const char *const *)p;
        for (uint64_t i = 0; out && i < len; i++) out[i] = strdup(in && in[i] ? in[i] : "");
        val.p = out;
    } else {
        size_t n = (size_t)len * elem_size(t);
        /* zeroed: a NULL array with a length must not send what the heap held */
        void *out = calloc(n ? n : 1, 1);
        if (out && n && p) memcpy(out, p, n);
        val.p = out;
    }
}

void DataElement::set_array(const void *p, DataType t, uint32_t len) { set_array(p, t, (uint64_t)len); }

/* ---- Packet ---- */

PacketPtr Packet::NullPacket;

Packet::Packet(Rank isrc, unsigned int istream_id, int itag)
    : stream_id(istream_id), tag(itag), src_rank(isrc) {}

Packet::Packet(unsigned int istream_id, int itag, const char *ifmt, ...)
    : stream_id(istream_id), tag(itag), src_rank(UnknownRank) {
    va_list ap;
    va_start(ap, ifmt);
    fill(ifmt, ap);
    va_end(ap);
}

Packet::Packet(const char *ifmt, va_list idata, unsigned int istream_id, int itag)
    : stream_id(istream_id), tag(itag), src_rank(UnknownRank) {
    va_list ap;
    va_copy(ap, idata);
    fill(ifmt, ap);
    va_end(ap);
}

Packet::Packet(unsigned int istream_id, int itag, const void **idata, const char *ifmt)
    : stream_id(istream_id), tag(itag), src_rank(UnknownRank) {
    std::vector<std::string> toks;
    fmt_str = ifmt ? ifmt : "";
    if (!tokens(ifmt, toks) || !idata) {
        error(ERR_FORMATSTR, UnknownRank, "no format string or no values");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < toks.size(); i++) {
        DataType t = Fmt2Type(toks[i].c_str());
        DataElement *e = new DataElement;
        const void *v = idata[k++];
        switch (t) {
        case CHAR_T: e->set_char(*(const char *)v); break;
        case UCHAR_T: e->set_uchar(*(const unsigned char *)v); break;
        case INT16_T: e->set_int16_t(*(const int16_t *)v); break;
        case UINT16_T: e->set_uint16_t(*(const uint16_t *)v); break;
        case INT32_T: e->set_int32_t(*(const int32_t *)v); break;
        case UINT32_T: e->set_uint32_t(*(const uint32_t *)v); break;
        case INT64_T: e->set_int64_t(*(const int64_t *)v); break;
        case UINT64_T: e->set_uint64_t(*(const uint64_t *)v); break;
        case FLOAT_T: e->set_float(*(const float *)v); break;
        case DOUBLE_T: e->set_double(*(const double *)v); break;
        case STRING_T: e->set_string((const char *)v); break;
        case UNKNOWN_T:
            delete e;
            error(ERR_FORMATSTR, UnknownRank, "unknown format specifier %%%s", toks[i].c_str());
            return;
        default: {
            const void *lenp = idata[k++];
            uint64_t n = is_large(t) ? *(const uint64_t *)lenp : *(const uint32_t *)lenp;
            e->set_array(v, t, n);
        }
        }
        data_elements.push_back(e);
    }
}

int Packet::fill(const char *ifmt, va_list ap) {
    std::vector<std::string> toks;
    fmt_str = ifmt ? ifmt : "";
    if (!tokens(ifmt, toks)) {
        error(ERR_FORMATSTR, UnknownRank, "no format string");
        return -1;
    }
    for (size_t i = 0; i < toks.size(); i++) {
        DataType t = Fmt2Type(toks[i].c_str());
        if (t == UNKNOWN_T) {
            error(ERR_FORMATSTR, UnknownRank, "unknown format specifier %%%s in \"%s\"", toks[i].c_str(), ifmt);
            return -1;
        }
        DataElement *e = new DataElement;
        switch (t) {
        case CHAR_T: e->set_char((char)va_arg(ap, int)); break;
        case UCHAR_T: e->set_uchar((unsigned char)va_arg(ap, unsigned int)); break;
        case INT16_T: e->set_int16_t((int16_t)va_arg(ap, int)); break;
        case UINT16_T: e->set_uint16_t((uint16_t)va_arg(ap, unsigned int)); break;
        case INT32_T: e->set_int32_t(va_arg(ap, int32_t)); break;
        case UINT32_T: e->set_uint32_t(va_arg(ap, uint32_t)); break;
        case INT64_T: e->set_int64_t(va_arg(ap, int64_t)); break;
        case UINT64_T: e->set_uint64_t(va_arg(ap, uint64_t)); break;
        case FLOAT_T: e->set_float((float)va_arg(ap, double)); break;
        case DOUBLE_T: e->set_double(va_arg(ap, double)); break;
        case STRING_T: e->set_string(va_arg(ap, const char *)); break;
        default: {
            const void *p = va_arg(ap, const void *);
            uint64_t n = is_large(t) ? va_arg(ap, uint64_t) : (uint64_t)va_arg(ap, uint32_t);
            e->set_array(p, t, n);
        }
        }
        data_elements.push_back(e);
    }
    return 0;
}

Packet::~Packet() {
    for (size_t i = 0; i < data_elements.size(); i++) delete data_elements[i];
}

void Packet::add_DataElement(DataElement *e) {
    if (!fmt_str.empty()) fmt_str += ' ';
    fmt_str += tc_spec(e->get_Type());
    data_elements.push_back(e);
}

/* An array and a large array of the same elements match (treecast carries both as one kind). */
static bool same_kind(DataType have, DataType want) {
    return have == want || (is_array(have) && is_array(want) && tc_code(have) == tc_code(want));
}

int Packet::unpack(const char *ifmt, ...) {
    va_list ap;
    va_start(ap, ifmt);
    int r = unpack(ap, ifmt, false);
    va_end(ap);
    return r;
}

int Packet::unpack(va_list iarg_list, const char *ifmt, bool) {
    std::vector<std::string> toks;
    if (!tokens(ifmt, toks) || toks.size() != data_elements.size()) {
        error(ERR_FORMATSTR, src_rank, "unpack: format \"%s\" names %zu values, the packet (\"%s\") has %zu",
              ifmt ? ifmt : "(null)", toks.size(), fmt_str.c_str(), data_elements.size());
        return -1;
    }
    for (size_t i = 0; i < toks.size(); i++) {
        DataType want = Fmt2Type(toks[i].c_str());
        if (want == UNKNOWN_T || !same_kind(data_elements[i]->type, want)) {
            error(ERR_PACKING, src_rank, "unpack: value %zu is %s, the format asks for %%%s", i + 1,
                  tc_spec(data_elements[i]->type), toks[i].c_str());
            return -1;
        }
    }
    va_list ap;
    va_copy(ap, iarg_list);
    for (size_t i = 0; i < toks.size(); i++) {
        const DataElement *e = data_elements[i];
        DataType want = Fmt2Type(toks[i].c_str());
        switch (e->type) {
        case CHAR_T: *va_arg(ap, char *) = e->val.c; break;
        case UCHAR_T: *va_arg(ap, unsigned char *) = e->val.uc; break;
        case INT16_T: *va_arg(ap, int16_t *) = e->val.hd; break;
        case UINT16_T: *va_arg(ap, uint16_t *) = e->val.uhd; break;
        case INT32_T: *va_arg(ap, int32_t *) = e->val.d; break;
        case UINT32_T: *va_arg(ap, uint32_t *) = e->val.ud; break;
        case INT64_T: *va_arg(ap, int64_t *) = e->val.ld; break;
        case UINT64_T: *va_arg(ap, uint64_t *) = e->val.uld; break;
        case FLOAT_T: *va_arg(ap, float *) = e->val.f; break;
        case DOUBLE_T: *va_arg(ap, double *) = e->val.lf; break;
        case STRING_T: *va_arg(ap, char **) = strdup(e->val.p ? (const char *)e->val.p : ""); break;
        default: {
            void **out = va_arg(ap, void **);
            if (e->type == STRING_ARRAY_T || e->type == STRING_LRG_ARRAY_T) {
                char **copy = (char **)malloc((e->array_len ? e->array_len : 1) * sizeof(char *));
                for (uint64_t j = 0; copy && j < e->array_len; j++) copy[j] = strdup(((char **)e->val.p)[j]);
                *out = e->array_len ? copy : (free(copy), (void *)NULL);
            } else {
                size_t n = (size_t)e->array_len * elem_size(e->type);
                void *copy = n ? malloc(n) : NULL;
                if (copy) memcpy(copy, e->val.p, n);
                *out = copy;
            }
            if (is_large(want))
                *va_arg(ap, uint64_t *) = e->array_len;
            else
                *va_arg(ap, uint32_t *) = (uint32_t)e->array_len;
        }
        }
    }
    va_end(ap);
    return 0;
}

const DataElement *Packet::operator[](unsigned int i) const {
    return i < data_elements.size() ? data_elements[i] : NULL;
}

int Packet::get_Tag(void) const { return tag; }
unsigned int Packet::get_StreamId(void) const { return stream_id; }
const char *Packet::get_FormatString(void) const { return fmt_str.c_str(); }
Rank Packet::get_InletNodeRank(void) const { return src_rank; }
Rank Packet::get_SourceRank(void) const { return src_rank; }

bool Packet::get_Destinations(unsigned &num_dest, Rank **out) {
    num_dest = (unsigned)dests.size();
    if (out) *out = dests.empty() ? NULL : &dests[0];
    return true;
}

bool Packet::set_Destinations(const Rank *bes, unsigned int num_bes) {
    dests.assign(bes, bes + num_bes);
    return true;
}

bool Packet::operator==(const Packet &o) const {
    if (tag != o.tag || stream_id != o.stream_id || tc_format(*this) != tc_format(o)) return false;
    std::vector<uint8_t> a, b;
    encode_payload(*this, a);
    encode_payload(o, b);
    return a == b;
}

bool Packet::operator!=(const Packet &o) const { return !(*this == o); }
void Packet::set_DestroyData(bool) {}

/* ---- treecast payloads ---- */

namespace compat {

static void put_u32(std::vector<uint8_t> &out, uint32_t v) {
    const uint8_t *b = (const uint8_t *)&v; /* little-endian hosts, as the payload */
    out.insert(out.end(), b, b + 4);
}

static void put_str(std::vector<uint8_t> &out, const char *s) {
    size_t n = s ? strlen(s) : 0;
    put_u32(out, (uint32_t)n);
    out.insert(out.end(), (const uint8_t *)s, (const uint8_t *)s + n);
}

void encode_payload(const Packet &p, std::vector<uint8_t> &out) {
    for (unsigned int i = 0; i < p.get_NumDataElements(); i++) {
        const DataElement *e = p[i];
        DataType t = e->get_Type();
        uint32_t code = tc_code(t);
        out.push_back((uint8_t)code);
        if (t == STRING_T) {
            put_str(out, e->get_string());
        } else if (code & 0x40) {
            DataType et;
            uint64_t n = 0;
            const void *data = e->get_array(&et, &n);
            put_u32(out, (uint32_t)n);
            if (t == STRING_ARRAY_T || t == STRING_LRG_ARRAY_T) {
                for (uint64_t j = 0; j < n; j++) put_str(out, ((char *const *)data)[j]);
            } else {
                const uint8_t *b = (const uint8_t *)data;
                out.insert(out.end(), b, b + (size_t)n * elem_size(t));
            }
        } else {
            const uint8_t *b = (const uint8_t *)&e->val;
            out.insert(out.end(), b, b + elem_size(t));
        }
    }
}

/* A bounded cursor. */
struct Cursor {
    const uint8_t *p;
    size_t left;
    bool take(void *out, size_t n) {
        if (left < n) return false;
        if (out) memcpy(out, p, n);
        p += n;
        left -= n;
        return true;
    }
};

static bool read_str(Cursor &c, std::string &s) {
    uint32_t n;
    if (!c.take(&n, 4) || c.left < n) return false;
    s.assign((const char *)c.p, n);
    c.p += n;
    c.left -= n;
    return true;
}

static DataElement *read_value(Cursor &c, std::string &err) {
    uint8_t code;
    if (!c.take(&code, 1)) {
        err = "a value is cut short";
        return NULL;
    }
    DataType t = from_tc_code(code);
    if (t == UNKNOWN_T) {
        char m[64];
        snprintf(m, sizeof m, "unknown type code 0x%02x", code);
        err = m;
        return NULL;
    }
    DataElement *e = new DataElement;
    bool ok = true;
    if (t == STRING_T) {
        std::string s;
        ok = read_str(c, s);
        if (ok) e->set_string(s.c_str());
    } else if (code & 0x40 || code == 0x20) {
        uint32_t n = 0;
        ok = c.take(&n, 4);
        /* the count comes from the wire: every element takes at least 4 bytes (a
         * string's length) or its size, so a count the payload cannot hold is refused
         * before anything is allocated for it */
        if (ok && t == STRING_ARRAY_T && n > c.left / 4) ok = false;
        if (ok && t == STRING_ARRAY_T) {
            std::vector<std::string> strs(n);
            std::vector<const char *> ptrs(n);
            for (uint32_t j = 0; ok && j < n; j++) {
                ok = read_str(c, strs[j]);
                ptrs[j] = strs[j].c_str();
            }
            if (ok) e->set_array(n ? &ptrs[0] : NULL, t, (uint64_t)n);
        } else if (ok) {
            size_t bytes = (size_t)n * elem_size(t);
            ok = c.left >= bytes;
            if (ok) {
                e->set_array(c.p, t, (uint64_t)n);
                c.take(NULL, bytes);
            }
        }
    } else {
        DataValue v;
        v.uld = 0;
        ok = c.take(&v, elem_size(t));
        if (ok) {
            switch (t) {
            case CHAR_T: e->set_char(v.c); break;
            case UCHAR_T: e->set_uchar(v.uc); break;
            case INT16_T: e->set_int16_t(v.hd); break;
            case UINT16_T: e->set_uint16_t(v.uhd); break;
            case INT32_T: e->set_int32_t(v.d); break;
            case UINT32_T: e->set_uint32_t(v.ud); break;
            case INT64_T: e->set_int64_t(v.ld); break;
            case UINT64_T: e->set_uint64_t(v.uld); break;
            case FLOAT_T: e->set_float(v.f); break;
            default: e->set_double(v.lf); break;
            }
        }
    }
    if (!ok) {
        delete e;
        err = "a value is cut short";
        return NULL;
    }
    return e;
}

PacketPtr decode_payload_from(const uint8_t *data, size_t len, size_t skip, Rank src, unsigned int stream,
                              int tag, std::string &err) {
    PacketPtr p(new Packet(src, stream, tag));
    Cursor c = {data, len};
    size_t i = 0;
    while (c.left > 0) {
        DataElement *e = read_value(c, err);
        if (!e) return PacketPtr();
        if (i++ < skip)
            delete e;
        else
            p->add_DataElement(e);
    }
    return p;
}

PacketPtr decode_payload(const uint8_t *data, size_t len, Rank src, unsigned int stream, int tag,
                         std::string &err) {
    return decode_payload_from(data, len, 0, src, stream, tag, err);
}

const char *const ADAPTER_NAME = "mrnet_filter";

}  // namespace compat
}  // namespace MRN
