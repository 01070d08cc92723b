/* filter_adapter.cpp: the treecast plug-in filter (include/treecast_filter.h) that
 * runs MRNet filter functions. Its stream parameters name the function, the shared
 * object's identity and (at creation) its bytes, then the tool's own parameters; the
 * object is loaded once per process from a sealed memory file, so no node needs a
 * shared file system. Built into libmrnet as bytes (adapter_blob.S). */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "internal.h"
#include "mrnet/NetworkTopology.h"
#include "mrnet/Packet.h"
#include "treecast_filter.h"

using namespace MRN;
using namespace MRN::compat;

namespace {

typedef void (*mrn_filter_fn)(std::vector<PacketPtr> &, std::vector<PacketPtr> &, std::vector<PacketPtr> &, void **,
                              PacketPtr &, const TopologyLocalInfo &);

/* Ranks of non-back-end nodes, as the layer numbers them (network.cpp). */
const Rank INTERNAL_RANK_BASE = 1000000;

std::mutex libs_mu;
std::map<std::string, void *> libs; /* identity -> handle; never unloaded */

struct Instance {
    mrn_filter_fn fn;
    void *state;
    PacketPtr params;
    std::string func;
};

void say(char *err, size_t err_len, const std::string &m) {
    if (!err || !err_len) return;
    size_t n = m.size() < err_len - 1 ? m.size() : err_len - 1;
    memcpy(err, m.data(), n);
    err[n] = 0;
}

/* MRNet filter objects call the packet code they expect from their host process:
 * make this plug-in's symbols visible to the objects loaded after it. */
void make_global() {
    static bool done = false;
    if (done) return;
    done = true;
    Dl_info info;
    if (dladdr((void *)&make_global, &info) && info.dli_fname) dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
}

/* The handle of the object `identity`, loading `bytes` when it is new here. */
void *library(const std::string &identity, const uint8_t *bytes, size_t len, std::string &why) {
    std::lock_guard<std::mutex> g(libs_mu);
    std::map<std::string, void *>::iterator it = libs.find(identity);
    if (it != libs.end()) return it->second;
    if (!len) {
        why = "the filter object " + identity + " was never shipped to this node";
        return NULL;
    }
    make_global();
    int fd = memfd_create("mrnet-filter", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        why = std::string("memfd_create: ") + strerror(errno);
        return NULL;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, bytes + off, len - off);
        if (w <= 0) {
            why = std::string("writing the filter object to a memory file: ") + strerror(errno);
            close(fd);
            return NULL;
        }
        off += (size_t)w;
    }
    fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        why = std::string("loading the MRNet filter object: ") + (e ? e : "dlopen failed");
        close(fd);
        return NULL;
    }
    /* The descriptor stays open: the object is never unloaded. */
    libs[identity] = h;
    return h;
}

/* Reads the adapter's parameters into `inst`: the function (loaded if `inst` has
 * none yet) and the tool's own parameters. */
int32_t take_params(Instance *inst, const uint8_t *params, size_t len, char *err, size_t err_len) {
    if (!len) return TREECAST_OK; /* made before its parameters: passes packets through */
    std::string why;
    PacketPtr all = decode_payload(params, len, UnknownRank, 0, 0, why);
    if (!all || all->get_NumDataElements() < 3 || (*all)[0]->get_Type() != STRING_T ||
        (*all)[1]->get_Type() != STRING_T) {
        say(err, err_len, "mrnet_filter: parameters are not \"%s %s %b ...\" (function, object, bytes): " + why);
        return TREECAST_ERR_PARAMS;
    }
    std::string func = (*all)[0]->get_string();
    if (!inst->fn) {
        uint64_t n = 0;
        DataType t;
        const void *bytes = (*all)[2]->get_array(&t, &n);
        if (t != UCHAR_ARRAY_T && t != CHAR_ARRAY_T) {
            say(err, err_len, "mrnet_filter " + func + ": the object's bytes (third parameter) are not %b");
            return TREECAST_ERR_PARAMS;
        }
        void *h = library((*all)[1]->get_string(), (const uint8_t *)bytes, (size_t)n, why);
        if (!h) {
            say(err, err_len, "mrnet_filter " + func + ": " + why);
            return TREECAST_ERR_PARAMS;
        }
        void *f = dlsym(h, func.c_str());
        if (!f) {
            say(err, err_len, "mrnet_filter: the filter object has no function " + func +
                                  " (declare it extern \"C\")");
            return TREECAST_ERR_PARAMS;
        }
        inst->fn = (mrn_filter_fn)f;
        inst->func = func;
    }
    inst->params = decode_payload_from(params, len, 3, UnknownRank, 0, 0, why);
    if (!inst->params) inst->params = PacketPtr(new Packet(UnknownRank, 0u, 0));
    return TREECAST_OK;
}

int32_t create(const uint8_t *params, size_t params_len, const treecast_place *, void **state, char *err,
               size_t err_len) {
    try {
        /* owned here until it is handed over, so a throw on the way frees it */
        std::unique_ptr<Instance> inst(new Instance());
        inst->fn = NULL;
        inst->state = NULL;
        inst->params = PacketPtr(new Packet(UnknownRank, 0u, 0));
        int32_t r = take_params(inst.get(), params, params_len, err, err_len);
        if (r != TREECAST_OK) return r;
        *state = inst.release();
        return TREECAST_OK;
    } catch (const std::exception &e) {
        say(err, err_len, std::string("mrnet_filter: ") + e.what());
        return TREECAST_ERR_PARAMS;
    } catch (...) {
        say(err, err_len, "mrnet_filter: an exception while reading the parameters");
        return TREECAST_ERR_PARAMS;
    }
}

int32_t emit_all(const std::vector<PacketPtr> &pkts, uint32_t dir, const treecast_host *host, treecast_sink *sink,
                 char *err, size_t err_len) {
    for (size_t i = 0; i < pkts.size(); i++) {
        if (!pkts[i]) continue;
        std::vector<uint8_t> out;
        encode_payload(*pkts[i], out);
        if (host->emit(sink, dir, pkts[i]->get_Tag(), out.empty() ? NULL : &out[0], out.size()) != 0) {
            say(err, err_len, "mrnet_filter: the node refused a packet the filter made");
            return TREECAST_ERR_FILTER;
        }
    }
    return TREECAST_OK;
}

int32_t reduce(void *state, const treecast_place *place, const treecast_packet *packets, size_t n,
               const treecast_host *host, treecast_sink *sink, uint32_t *bad_rank, char *err, size_t err_len) {
    Instance *inst = (Instance *)state;
    try {
        if (!inst->fn) {
            for (size_t i = 0; i < n; i++)
                if (host->emit(sink, TREECAST_UP, packets[i].tag, packets[i].payload, packets[i].payload_len) != 0)
                    return TREECAST_ERR_FILTER;
            return TREECAST_OK;
        }
        std::vector<PacketPtr> in, out, rev;
        for (size_t i = 0; i < n; i++) {
            std::string why;
            PacketPtr p = decode_payload(packets[i].payload, packets[i].payload_len, packets[i].rank,
                                         mrn_stream_id(place->stream), packets[i].tag, why);
            if (!p) {
                *bad_rank = packets[i].rank;
                say(err, err_len, "mrnet_filter: a packet's values cannot be read: " + why);
                return TREECAST_ERR_PACKET;
            }
            in.push_back(p);
        }
        Rank rank = place->role == TREECAST_ROLE_BACK_END ? place->rank : INTERNAL_RANK_BASE + place->rank;
        TopologyLocalInfo info(rank, place->children, place->depth, place->leaves);
        inst->fn(in, out, rev, &inst->state, inst->params, info);
        for (size_t i = 0; i < out.size(); i++)
            if (out[i]) out[i]->set_StreamId(mrn_stream_id(place->stream));
        int32_t r = emit_all(out, TREECAST_UP, host, sink, err, err_len);
        return r != TREECAST_OK ? r : emit_all(rev, TREECAST_DOWN, host, sink, err, err_len);
    } catch (const std::exception &e) {
        say(err, err_len, "mrnet_filter " + inst->func + " threw: " + e.what());
        return TREECAST_ERR_FILTER;
    } catch (...) {
        say(err, err_len, "mrnet_filter " + inst->func + " threw an exception");
        return TREECAST_ERR_FILTER;
    }
}

int32_t get_state(void *, const treecast_host *, treecast_sink *, char *, size_t) { return TREECAST_OK; }

int32_t set_params(void *state, const uint8_t *params, size_t params_len, char *err, size_t err_len) {
    try {
        return take_params((Instance *)state, params, params_len, err, err_len);
    } catch (const std::exception &e) {
        say(err, err_len, std::string("mrnet_filter: ") + e.what());
        return TREECAST_ERR_PARAMS;
    } catch (...) {
        say(err, err_len, "mrnet_filter: an exception while reading the parameters");
        return TREECAST_ERR_PARAMS;
    }
}

void destroy(void *state) { delete (Instance *)state; }

const treecast_filter_table TABLE = {
    TREECAST_FILTER_ABI_VERSION,
    (uint32_t)sizeof(treecast_filter_table),
    "mrnet_filter",
    1,
    0,
    0,
    create,
    reduce,
    get_state,
    set_params,
    destroy,
    NULL,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const treecast_filter_table *treecast_filter_v1(void) {
    return &TABLE;
}
