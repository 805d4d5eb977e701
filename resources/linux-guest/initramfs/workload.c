// SPDX-License-Identifier: GPL-2.0
/* The workload `perf record` samples in the real-VMX initramfs: one known hot function. */
#include <stdio.h>

static volatile unsigned long sink;

__attribute__((noinline, noipa)) unsigned long vpmu_hot_loop(unsigned long n)
{
	unsigned long x = n, i;

	for (i = 0; i < n; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	return x;
}

int main(void)
{
	sink = vpmu_hot_loop(300000000UL);
	printf("vpmu-workload: done (%lu)\n", sink);
	return 0;
}
