/* mrnet/Error.h: the error state every MRNet object carries. */
#ifndef __Error_h
#define __Error_h

#include <cstdio>
#include <list>

#include "mrnet/Types.h"

namespace MRN {

typedef enum { ERR_INFO = 0, ERR_WARN, ERR_ERR, ERR_CRIT, ERR_LEVEL_LAST } ErrorLevel;
typedef enum { ERR_IGNORE = 0, ERR_ALERT, ERR_RETRY, ERR_ABORT, ERR_RESPONSE_LAST } ErrorResponse;
typedef enum {
    ERR_NONE = 0,
    ERR_TOPOLOGY_FORMAT,
    ERR_TOPOLOGY_CYCLE,
    ERR_TOPOLOGY_NOTCONNECTED,
    ERR_NETWORK_FAILURE,
    ERR_FORMATSTR,
    ERR_PACKING,
    ERR_INTERNAL,
    ERR_SYSTEM,
    ERR_CODE_LAST
} ErrorCode;

typedef struct {
    ErrorCode code;
    ErrorLevel level;
    ErrorResponse response;
    const char *msg;
} ErrorDef;

extern ErrorDef errors[];

/* The last error of an object, with treecast's message (what failed and what to do). */
class Error {
 protected:
    mutable ErrorCode MRN_errno;
    mutable char MRN_errmsg[512];

 public:
    inline bool has_Error() const { return MRN_errno != ERR_NONE; }
    inline ErrorCode get_Error() const { return MRN_errno; }
    inline const char *get_ErrorStr(ErrorCode err) const {
        return errors[err < ERR_CODE_LAST ? err : ERR_CODE_LAST].msg;
    }
    /* Prints `str: ` and the last error, with treecast's message, to stderr. */
    void perror(const char *str) const;
    Error() : MRN_errno(ERR_NONE) { MRN_errmsg[0] = 0; }
    virtual ~Error() {}
    virtual void error(ErrorCode, Rank, const char *, ...) const;
};

} /* namespace MRN */

#endif /* __Error_h */
