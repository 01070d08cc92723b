/* mrnet/FilterIds.h: the ids of the built-in filters (treecast's built-ins). */
#ifndef MRN_FILTERS_H
#define MRN_FILTERS_H

namespace MRN {

typedef unsigned short FilterId;
extern FilterId TFILTER_NULL;
extern FilterId TFILTER_SUM;
extern FilterId TFILTER_AVG;
extern FilterId TFILTER_MIN;
extern FilterId TFILTER_MAX;
extern FilterId TFILTER_ARRAY_CONCAT;
extern FilterId TFILTER_INT_EQ_CLASS;
extern FilterId TFILTER_EPK_UNIFY;
extern FilterId TFILTER_PERFDATA;
extern FilterId TFILTER_TOPO_UPDATE;
extern FilterId TFILTER_TOPO_UPDATE_DOWNSTREAM;
extern FilterId SFILTER_DONTWAIT;
extern FilterId SFILTER_WAITFORALL;
extern FilterId SFILTER_TIMEOUT;

} /* namespace MRN */

#endif /* MRN_FILTERS_H */
