/* xplat/Monitor.h: included by MRNet's headers; nothing a tool needs from it here. */
#ifndef XPLAT_MONITOR_H
#define XPLAT_MONITOR_H
#include "xplat/Mutex.h"
#endif
