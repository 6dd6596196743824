/* Accessors for what DPDK exposes only as macros or per-lcore (thread-local) variables,
 * which bindgen cannot turn into something callable. */
#ifndef URDMA_DPDK_HELPERS_H
#define URDMA_DPDK_HELPERS_H

#include <stdint.h>

/* Current value of rte_errno for the calling thread. */
int urdma_rte_errno(void);

/* Set rte_errno for the calling thread (tests restore it). */
void urdma_rte_errno_set(int value);

#endif
