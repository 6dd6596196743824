#include <rte_config.h>
#include <rte_errno.h>
#include "helpers.h"

int urdma_rte_errno(void)
{
	return rte_errno;
}

void urdma_rte_errno_set(int value)
{
	rte_errno = value;
}
