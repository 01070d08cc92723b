// prefix_tree.cpp: a treecast plug-in filter in C++ that merges call-graph prefix
// trees, as a STAT-like tool does: each back-end sends its stack trace, every comm
// node merges its children's trees, and the front-end gets one tree whose every
// node (a call path) lists the ranks whose stacks pass through it.
//
// A back-end's packet is "%as": its frames, outermost first ("main", "solve", ...).
// A merged tree is "%as %as": the call paths ("main", "main/solve", ...) in order,
// and for each the ranks as a sorted comma-separated list ("0,1,3"). A node accepts
// both, so the filter runs at every level. No parameters; the state is the number
// of waves merged here.
//
//   c++ -std=c++17 -shared -fPIC -I include -o libprefix_tree.so examples/filters/prefix_tree.cpp
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "treecast_filter.h"
#include "treecast_filter_helpers.h"

namespace {

using Tree = std::map<std::string, std::set<uint32_t>>;

struct Instance {
    uint64_t waves = 0;
};

// Reads a "%as" value; false when the payload holds something else.
bool read_strings(tc_reader &r, std::vector<std::string> &out) {
    uint32_t n;
    if (r.left < 5 || r.p[0] != (TC_ARRAY | TC_STR)) return false;
    std::memcpy(&n, r.p + 1, 4);
    r.p += 5;
    r.left -= 5;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len;
        if (r.left < 4) return false;
        std::memcpy(&len, r.p, 4);
        if (r.left - 4 < len) return false;
        out.emplace_back(reinterpret_cast<const char *>(r.p + 4), len);
        r.p += 4 + len;
        r.left -= 4 + len;
    }
    return true;
}

void put_strings(tc_buf &b, const std::vector<std::string> &items) {
    uint8_t code = TC_ARRAY | TC_STR;
    uint32_t n = static_cast<uint32_t>(items.size());
    tc_put_raw(&b, &code, 1);
    tc_put_raw(&b, &n, 4);
    for (const auto &s : items) {
        uint32_t len = static_cast<uint32_t>(s.size());
        tc_put_raw(&b, &len, 4);
        tc_put_raw(&b, s.data(), len);
    }
}

// Adds one packet to the tree; false (with why) when it is neither form.
bool merge(const treecast_packet &p, Tree &tree, std::string &why) {
    tc_reader r = tc_reader_of(p.payload, p.payload_len);
    std::vector<std::string> first;
    if (!read_strings(r, first)) {
        why = std::string("expected \"%as\" or \"%as %as\", got \"") + p.format + "\"";
        return false;
    }
    if (r.left == 0) {
        // A stack trace: every prefix of it is a node.
        std::string path;
        for (const auto &frame : first) {
            path += path.empty() ? frame : "/" + frame;
            tree[path].insert(p.rank);
        }
        return true;
    }
    std::vector<std::string> ranks;
    if (!read_strings(r, ranks) || r.left != 0 || ranks.size() != first.size()) {
        why = "a merged tree needs as many rank lists as paths";
        return false;
    }
    for (size_t i = 0; i < first.size(); i++) {
        std::stringstream list(ranks[i]);
        std::string rank;
        while (std::getline(list, rank, ',')) {
            if (!rank.empty()) tree[first[i]].insert(static_cast<uint32_t>(std::stoul(rank)));
        }
    }
    return true;
}

int32_t create(const uint8_t *, size_t params_len, const treecast_place *, void **state, char *err,
               size_t err_len) {
    if (params_len != 0) {
        tc_error(err, err_len, "prefix_tree takes no parameters");
        return TREECAST_ERR_PARAMS;
    }
    try {
        *state = new Instance();
    } catch (...) {
        tc_error(err, err_len, "out of memory");
        return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}

int32_t reduce(void *state, const treecast_place *, const treecast_packet *packets, size_t n,
               const treecast_host *host, treecast_sink *sink, uint32_t *bad_rank, char *err, size_t err_len) {
    // No C++ exception may cross the C ABI.
    try {
        Tree tree;
        for (size_t i = 0; i < n; i++) {
            std::string why;
            if (!merge(packets[i], tree, why)) {
                tc_error(err, err_len, why.c_str());
                *bad_rank = packets[i].rank;
                return TREECAST_ERR_PACKET;
            }
        }
        std::vector<std::string> paths, ranks;
        for (const auto &[path, members] : tree) {
            std::string list;
            for (uint32_t rank : members) list += (list.empty() ? "" : ",") + std::to_string(rank);
            paths.push_back(path);
            ranks.push_back(list);
        }
        tc_buf out = {};
        put_strings(out, paths);
        put_strings(out, ranks);
        int32_t code = out.failed ? -1 : host->emit(sink, TREECAST_UP, n > 0 ? packets[0].tag : 0, out.data, out.len);
        tc_buf_free(&out);
        if (code != 0) {
            tc_error(err, err_len, "the node refused the merged tree");
            return TREECAST_ERR_FILTER;
        }
        static_cast<Instance *>(state)->waves++;
        return TREECAST_OK;
    } catch (const std::exception &e) {
        tc_error(err, err_len, e.what());
    } catch (...) {
        tc_error(err, err_len, "an unknown C++ exception");
    }
    return TREECAST_ERR_FILTER;
}

int32_t get_state(void *state, const treecast_host *host, treecast_sink *sink, char *err, size_t err_len) {
    tc_buf out = {};
    tc_put_scalar(&out, TC_U64, &static_cast<Instance *>(state)->waves);
    int32_t code = out.failed ? -1 : host->emit(sink, TREECAST_STATE, 0, out.data, out.len);
    tc_buf_free(&out);
    if (code != 0) {
        tc_error(err, err_len, "the node refused the state");
        return TREECAST_ERR_FILTER;
    }
    return TREECAST_OK;
}

int32_t set_params(void *, const uint8_t *, size_t, char *err, size_t err_len) {
    tc_error(err, err_len, "prefix_tree takes no parameters");
    return TREECAST_ERR_PARAMS;
}

void destroy(void *state) { delete static_cast<Instance *>(state); }

const treecast_filter_table table = {
    TREECAST_FILTER_ABI_VERSION, sizeof(treecast_filter_table), "prefix_tree", 1, 0, 0,
    create, reduce, get_state, set_params, destroy,
};

}  // namespace

extern "C" const treecast_filter_table *treecast_filter_v1(void) { return &table; }
