/* tree.cpp: MRNet's topology generators (mrnet/Tree.h): a specification and host
 * lists in, an MRNet topology file out. */
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mrnet/Tree.h"

namespace MRN {

namespace {

typedef std::list<std::pair<std::string, unsigned> > Hosts;

/* How a host list entry gives places, as MRNet's generators differ. */
enum Rule {
    BELOW,     /* numbers below the host's count and the cap (one list) */
    PER_ENTRY, /* as many as the count and the cap allow, after the host's numbers so far */
    BALANCED   /* one, then more while below the count and the cap (balanced trees) */
};

/* Where processes go: "host:n", numbered per host from 0, the front-end's host from
 * 1 (it is "fe_host:0"), lists sharing the numbers. */
class Places {
 public:
    explicit Places(const std::string &fe_host) { _next[fe_host] = 1; }

    /* At most `limit` places: a list's later hosts keep their numbers for the next list. */
    std::vector<std::string> take(const Hosts &hosts, unsigned cap, Rule rule, size_t limit = (size_t)-1) {
        std::vector<std::string> out;
        for (Hosts::const_iterator h = hosts.begin(); h != hosts.end() && out.size() < limit; ++h) {
            unsigned &n = _next[h->first];
            unsigned most = h->second < cap ? h->second : cap;
            for (unsigned given = 0;; n++, given++) {
                bool more = rule == BELOW ? n < most : rule == PER_ENTRY ? given < most : given == 0 || n < most;
                if (!more || out.size() >= limit) break;
                char num[16];
                snprintf(num, sizeof num, ":%u", n);
                out.push_back(h->first + num);
            }
        }
        return out;
    }

 private:
    std::map<std::string, unsigned> _next;
};

/* Parses a decimal number below 10^9 at `s`; false on anything else. */
bool number(const std::string &s, unsigned &out) {
    if (s.empty() || s.size() > 9) return false;
    for (size_t i = 0; i < s.size(); i++)
        if (!isdigit((unsigned char)s[i])) return false;
    out = (unsigned)strtoul(s.c_str(), NULL, 10);
    return true;
}

/* As number, and at least 1. */
bool positive(const std::string &s, unsigned &out) { return number(s, out) && out > 0; }

/* The most nodes a generated tree may have. */
const unsigned long MAX_NODES = 100000000;

bool bad(const std::string &spec, const char *why) {
    fprintf(stderr, "MRNet topology \"%s\": %s\n", spec.c_str(), why);
    return false;
}

bool too_few(const std::string &spec, const char *what, size_t need, size_t have) {
    fprintf(stderr,
            "MRNet topology \"%s\": not enough hosts: it needs %zu %sprocesses besides the front-end and the "
            "hosts give %zu (add hosts, or raise the processes per host)\n",
            spec.c_str(), need, what, have);
    return false;
}

/* Reads "host" and "host:count" words from `next` (a word per call, false at the end)
 * into hosts, sorted by name, counts of a host named again added up. */
template <typename NextWord>
void read_hosts(NextWord next, Hosts &hosts) {
    std::map<std::string, unsigned> counts;
    std::string word;
    while (next(word)) {
        std::string::size_type colon = word.find(':');
        unsigned count = 1;
        if (colon != std::string::npos) {
            count = (unsigned)strtoul(word.c_str() + colon + 1, NULL, 10);
            word.erase(colon);
        }
        counts[word] += count;
    }
    for (std::map<std::string, unsigned>::iterator it = counts.begin(); it != counts.end(); ++it)
        hosts.push_back(*it);
}

}  // namespace

/* ---- Tree::Node ---- */

Tree::Node::Node(std::string n) : _name(n), visited(false) {}

void Tree::Node::add_Child(Node *n) {
    for (size_t i = 0; i < _children.size(); i++)
        if (_children[i] == n) return;
    _children.push_back(n);
}

void Tree::Node::print_ToFile(FILE *f) {
    if (_children.empty()) return;
    fprintf(f, "%s =>", _name.c_str());
    for (size_t i = 0; i < _children.size(); i++) fprintf(f, "\n\t%s", _children[i]->_name.c_str());
    fprintf(f, " ;\n\n");
    for (size_t i = 0; i < _children.size(); i++) _children[i]->print_ToFile(f);
}

unsigned int Tree::Node::visit() {
    if (visited) return 0;
    visited = true;
    unsigned int seen = 1;
    for (size_t i = 0; i < _children.size(); i++) {
        unsigned int below = _children[i]->visit();
        if (below == 0) return 0;
        seen += below;
    }
    return seen;
}

/* ---- Tree ---- */

Tree::Tree(std::string &fe_host, std::string &topology_spec, unsigned int be_procs_per_host,
           unsigned int int_procs_per_host)
    : root(NULL), _fe_host(fe_host), _topology_spec(topology_spec), _contains_cycle(false),
      _contains_unreachable_nodes(false), _valid(false), _num_leaves(0), _depth(0),
      _be_procs_per_host(be_procs_per_host), _int_procs_per_host(int_procs_per_host) {
    root = get_Node(_fe_host + ":0");
}

Tree::~Tree() {
    for (std::map<std::string, Node *>::iterator it = NodesByName.begin(); it != NodesByName.end(); ++it)
        delete it->second;
}

Tree::Node *Tree::get_Node(std::string hostname) {
    std::map<std::string, Node *>::iterator it = NodesByName.find(hostname);
    if (it != NodesByName.end()) return it->second;
    Node *n = new Node(hostname);
    NodesByName[hostname] = n;
    return n;
}

bool Tree::create_TopologyFile(FILE *ifile) {
    if (!ifile || !_valid) return false;
    root->print_ToFile(ifile);
    return true;
}

bool Tree::create_TopologyFile(const char *ifilename) {
    if (!_valid) return false;
    FILE *f = fopen(ifilename, "w");
    if (!f) {
        fprintf(stderr, "MRNet topology: cannot write %s: %s\n", ifilename, strerror(errno));
        return false;
    }
    root->print_ToFile(f);
    return fclose(f) == 0;
}

bool Tree::get_HostsFromFile(const char *ifilename, Hosts &hosts) {
    FILE *f = fopen(ifilename, "r");
    if (!f) {
        fprintf(stderr, "MRNet host list: cannot read %s: %s\n", ifilename, strerror(errno));
        return false;
    }
    get_HostsFromFileStream(f, hosts);
    fclose(f);
    return true;
}

void Tree::get_HostsFromFileStream(FILE *ifile, Hosts &hosts) {
    read_hosts(
        [ifile](std::string &word) {
            word.clear();
            int c;
            while ((c = fgetc(ifile)) != EOF && isspace(c)) {
            }
            for (; c != EOF && !isspace(c); c = fgetc(ifile)) word += (char)c;
            return !word.empty();
        },
        hosts);
}

void Tree::get_HostsFromBuffer(const char *ibuf, Hosts &hosts) {
    const char *p = ibuf ? ibuf : "";
    read_hosts(
        [&p](std::string &word) {
            while (*p && isspace((unsigned char)*p)) p++;
            const char *start = p;
            while (*p && !isspace((unsigned char)*p)) p++;
            word.assign(start, p);
            return !word.empty();
        },
        hosts);
}

bool Tree::validate() {
    for (std::map<std::string, Node *>::iterator it = NodesByName.begin(); it != NodesByName.end(); ++it)
        it->second->visited = false;
    unsigned int seen = root->visit();
    _contains_cycle = seen == 0;
    _contains_unreachable_nodes = seen != NodesByName.size();
    _valid = !_contains_cycle && !_contains_unreachable_nodes;
    return _valid;
}

/* Gives each node of `parents`, in order, its count of children from `pool` (from
 * `next` on); the children, in order, or false when the pool runs out. */
static bool adopt(Tree *tree, const std::vector<Tree::Node *> &parents, const std::vector<unsigned> &counts,
                  const std::vector<std::string> &pool, size_t &next, std::vector<Tree::Node *> &children) {
    for (size_t i = 0; i < parents.size() && i < counts.size(); i++) {
        for (unsigned k = 0; k < counts[i]; k++) {
            if (next >= pool.size()) return false;
            Tree::Node *child = tree->get_Node(pool[next++]);
            parents[i]->add_Child(child);
            children.push_back(child);
        }
    }
    return true;
}

/* ---- BalancedTree ---- */

bool BalancedTree::parse_Spec() {
    std::string spec = _topology_spec;
    std::string::size_type caret = spec.find('^');
    if (caret != std::string::npos) {
        unsigned fanout = 0, depth = 0;
        if (!positive(spec.substr(0, caret), fanout) || !positive(spec.substr(caret + 1), depth))
            return bad(spec, "a balanced tree is FANOUT^DEPTH (e.g. 16^2) or FANOUTxFANOUT... (e.g. 4x8)");
        if (depth > 1000) return bad(spec, "a depth of more than 1,000");
        unsigned long width = 1;
        for (unsigned d = 0; d < depth; d++) {
            if (width * fanout > MAX_NODES) return bad(spec, "more than 100,000,000 nodes");
            width *= fanout;
        }
        _fanouts.assign(depth, fanout);
        return true;
    }
    std::string::size_type start = 0;
    for (;;) {
        std::string::size_type x = spec.find('x', start);
        unsigned fanout = 0;
        if (!positive(spec.substr(start, x == std::string::npos ? std::string::npos : x - start), fanout))
            return bad(spec, "a balanced tree is FANOUT^DEPTH (e.g. 16^2) or FANOUTxFANOUT... (e.g. 4x8)");
        _fanouts.push_back(fanout);
        if (x == std::string::npos) return true;
        start = x + 1;
    }
}

/* Builds a balanced tree of `fanouts` from the internal and back-end places. */
static bool balanced(Tree *tree, Tree::Node *root, const std::string &spec, const std::vector<unsigned> &fanouts,
                     const std::vector<std::string> &internal, const std::vector<std::string> &backends,
                     unsigned &leaves) {
    size_t width = 1, need_internal = 0;
    for (size_t l = 0; l < fanouts.size(); l++) {
        if (width * fanouts[l] > MAX_NODES) return bad(spec, "more than 100,000,000 nodes");
        width *= fanouts[l];
        if (l + 1 < fanouts.size()) need_internal += width;
    }
    if (need_internal > internal.size()) return too_few(spec, "internal ", need_internal, internal.size());
    if (width > backends.size()) return too_few(spec, "back-end ", width, backends.size());
    std::vector<Tree::Node *> level(1, root);
    size_t next_internal = 0, next_be = 0;
    for (size_t l = 0; l < fanouts.size(); l++) {
        bool last = l + 1 == fanouts.size();
        std::vector<unsigned> counts(level.size(), fanouts[l]);
        std::vector<Tree::Node *> below;
        adopt(tree, level, counts, last ? backends : internal, last ? next_be : next_internal, below);
        level.swap(below);
    }
    leaves = (unsigned)level.size();
    return true;
}

BalancedTree::BalancedTree(std::string &topology_spec, std::string &fe_host, Hosts &hosts,
                           unsigned int max_procs_per_host)
    : Tree(fe_host, topology_spec, max_procs_per_host, max_procs_per_host) {
    if (!parse_Spec()) return;
    /* one list: internal nodes take its first places, back-ends the next */
    Places places(_fe_host);
    std::vector<std::string> all = places.take(hosts, max_procs_per_host, BALANCED);
    size_t internal = 0, width = 1;
    for (size_t l = 0; l < _fanouts.size(); l++) {
        if (width * _fanouts[l] > MAX_NODES) {
            bad(_topology_spec, "more than 100,000,000 nodes");
            return;
        }
        width *= _fanouts[l];
        if (l + 1 < _fanouts.size()) internal += width;
    }
    if (internal + width > all.size()) {
        too_few(_topology_spec, "", internal + width, all.size());
        return;
    }
    std::vector<std::string> backends(all.begin() + internal, all.end());
    all.resize(internal);
    _depth = (unsigned)_fanouts.size();
    if (balanced(this, root, _topology_spec, _fanouts, all, backends, _num_leaves)) validate();
}

BalancedTree::BalancedTree(std::string &topology_spec, std::string &fe_host, Hosts &backend_hosts,
                           Hosts &internal_hosts, unsigned int be_procs_per_host, unsigned int int_procs_per_host)
    : Tree(fe_host, topology_spec, be_procs_per_host, int_procs_per_host) {
    if (!parse_Spec()) return;
    Places places(_fe_host);
    size_t need_internal = 0, width = 1;
    for (size_t l = 0; l + 1 < _fanouts.size() && width <= MAX_NODES; l++) need_internal += width *= _fanouts[l];
    /* only the places it needs: a host in both lists keeps the rest for back-ends */
    std::vector<std::string> internal = places.take(internal_hosts, int_procs_per_host, BALANCED, need_internal);
    std::vector<std::string> backends = places.take(backend_hosts, be_procs_per_host, BALANCED);
    _depth = (unsigned)_fanouts.size();
    if (balanced(this, root, _topology_spec, _fanouts, internal, backends, _num_leaves)) validate();
}

/* ---- KnomialTree ---- */

bool KnomialTree::parse_Spec() {
    std::string::size_type at = _topology_spec.find('@');
    if (at == std::string::npos || !positive(_topology_spec.substr(0, at), _kfactor) ||
        !positive(_topology_spec.substr(at + 1), _num_nodes) || _kfactor < 2)
        return bad(_topology_spec, "a k-nomial tree is K@NODES with K at least 2 (e.g. 2@16)");
    return true;
}

/* Builds a k-nomial tree of `total` nodes: each round, every node placed before it
 * takes up to k-1 children. Children come from `internal`, those of the last round
 * from `backends` when there is such a list. */
static bool knomial(Tree *tree, const std::string &spec, unsigned k, unsigned total, Tree::Node *root,
                    const std::vector<std::string> &internal, const std::vector<std::string> *backends,
                    unsigned &depth, unsigned &leaves) {
    std::vector<Tree::Node *> nodes(1, root);
    size_t next_internal = 0, next_be = 0;
    unsigned placed = 1, parents = 0;
    while (placed < total) {
        bool last_round = backends && (unsigned long)placed * k >= total;
        size_t round_parents = nodes.size();
        depth++;
        for (size_t p = 0; p < round_parents && placed < total; p++) {
            for (unsigned c = 0; c + 1 < k && placed < total; c++, placed++) {
                const std::vector<std::string> &pool = last_round ? *backends : internal;
                size_t &next = last_round ? next_be : next_internal;
                if (next >= pool.size())
                    return backends ? too_few(spec, last_round ? "back-end " : "internal ", next + 1, pool.size())
                                    : too_few(spec, "", total - 1, pool.size());
                Tree::Node *child = tree->get_Node(pool[next++]);
                nodes[p]->add_Child(child);
                if (!last_round) nodes.push_back(child);
                if (c == 0) parents++;
            }
        }
    }
    leaves = total - parents;
    return true;
}

KnomialTree::KnomialTree(std::string &topology_spec, std::string &fe_host, Hosts &hosts,
                         unsigned int max_procs_per_host)
    : Tree(fe_host, topology_spec, max_procs_per_host, max_procs_per_host), _kfactor(0), _num_nodes(0) {
    if (!parse_Spec()) return;
    Places places(_fe_host);
    std::vector<std::string> all = places.take(hosts, max_procs_per_host, BELOW);
    if (knomial(this, _topology_spec, _kfactor, _num_nodes, root, all, NULL, _depth, _num_leaves)) validate();
}

KnomialTree::KnomialTree(std::string &topology_spec, std::string &fe_host, Hosts &backend_hosts,
                         Hosts &internal_hosts, unsigned int be_procs_per_host, unsigned int int_procs_per_host)
    : Tree(fe_host, topology_spec, be_procs_per_host, int_procs_per_host), _kfactor(0), _num_nodes(0) {
    if (!parse_Spec()) return;
    Places places(_fe_host);
    std::vector<std::string> internal = places.take(internal_hosts, int_procs_per_host, PER_ENTRY);
    std::vector<std::string> backends = places.take(backend_hosts, be_procs_per_host, PER_ENTRY);
    if (knomial(this, _topology_spec, _kfactor, _num_nodes, root, internal, &backends, _depth, _num_leaves))
        validate();
}

/* ---- GenericTree ---- */

bool GenericTree::parse_Spec() {
    const std::string &spec = _topology_spec;
    std::vector<unsigned> level;
    std::string item;
    for (size_t i = 0; i <= spec.size(); i++) {
        char c = i < spec.size() ? spec[i] : '\0';
        if (c == ',' || c == ':' || c == '\0') {
            /* an item: CHILDREN, or NODESxCHILDREN */
            std::string::size_type x = item.find('x');
            unsigned nodes = 1, children = 0;
            bool ok = x == std::string::npos ? number(item, children)
                                             : positive(item.substr(0, x), nodes) && number(item.substr(x + 1), children);
            if (!ok) {
                fprintf(stderr,
                        "MRNet topology \"%s\": column %zu: expected CHILDREN or NODESxCHILDREN (e.g. 2:3,0 or "
                        "4:4x8)\n",
                        spec.c_str(), i + 1);
                return false;
            }
            if (level.size() + nodes > MAX_NODES || (unsigned long)nodes * children > MAX_NODES)
                return bad(spec, "more than 100,000,000 nodes");
            level.insert(level.end(), nodes, children);
            item.clear();
            if (c != ',') {
                if (_children_by_level.empty() && level.size() != 1)
                    return bad(spec, "its first level is the front-end's: one number of children");
                _children_by_level.push_back(level);
                level.clear();
            }
        } else if (isdigit((unsigned char)c) || c == 'x') {
            item += c;
        } else {
            fprintf(stderr, "MRNet topology \"%s\": column %zu: '%c' is not a digit, ',', ':' or 'x'\n",
                    spec.c_str(), i + 1, c);
            return false;
        }
    }
    return true;
}

/* Builds a generic tree level by level: node i of a level has the i-th count of the
 * next level's spec as children, from `internal` (the last level from `backends`
 * when there is such a list). */
static bool generic(Tree *tree, const std::string &spec, const std::vector<std::vector<unsigned> > &levels,
                    Tree::Node *root, const std::vector<std::string> &internal,
                    const std::vector<std::string> *backends, unsigned &leaves) {
    std::vector<Tree::Node *> level(1, root);
    size_t next_internal = 0, next_be = 0;
    for (size_t l = 0; l < levels.size(); l++) {
        if (levels[l].size() > level.size()) {
            fprintf(stderr, "MRNet topology \"%s\": level %zu gives children to %zu nodes; the level above has %zu\n",
                    spec.c_str(), l + 1, levels[l].size(), level.size());
            return false;
        }
        bool from_backends = backends && l + 1 == levels.size();
        const std::vector<std::string> &pool = from_backends ? *backends : internal;
        size_t &next = from_backends ? next_be : next_internal;
        size_t need = next;
        for (size_t i = 0; i < levels[l].size(); i++) need += levels[l][i];
        if (need > pool.size())
            return too_few(spec, from_backends ? "back-end " : (backends ? "internal " : ""), need, pool.size());
        std::vector<Tree::Node *> below;
        adopt(tree, level, levels[l], pool, next, below);
        /* nodes of this level beyond its spec are leaves */
        leaves += (unsigned)(level.size() - levels[l].size());
        for (size_t i = 0; i < levels[l].size(); i++)
            if (levels[l][i] == 0) leaves++;
        level.swap(below);
    }
    leaves += (unsigned)level.size();
    return true;
}

GenericTree::GenericTree(std::string &topology_spec, std::string &fe_host, Hosts &hosts,
                         unsigned int max_procs_per_host)
    : Tree(fe_host, topology_spec, max_procs_per_host, max_procs_per_host) {
    if (!parse_Spec()) return;
    Places places(_fe_host);
    std::vector<std::string> all = places.take(hosts, max_procs_per_host, BELOW);
    _depth = (unsigned)_children_by_level.size();
    if (generic(this, _topology_spec, _children_by_level, root, all, NULL, _num_leaves)) validate();
}

GenericTree::GenericTree(std::string &topology_spec, std::string &fe_host, Hosts &backend_hosts,
                         Hosts &internal_hosts, unsigned int be_procs_per_host, unsigned int int_procs_per_host)
    : Tree(fe_host, topology_spec, be_procs_per_host, int_procs_per_host) {
    if (!parse_Spec()) return;
    Places places(_fe_host);
    std::vector<std::string> internal = places.take(internal_hosts, int_procs_per_host, PER_ENTRY);
    std::vector<std::string> backends = places.take(backend_hosts, be_procs_per_host, PER_ENTRY);
    _depth = (unsigned)_children_by_level.size();
    if (generic(this, _topology_spec, _children_by_level, root, internal, &backends, _num_leaves)) validate();
}

GenericTree::~GenericTree() {}

}  // namespace MRN
