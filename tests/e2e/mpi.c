// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
// A small MPI program for tests/vm/66-e2e-mpi.sh: a ping-pong between ranks 0 and 1 over a
// range of sizes (eager and rendezvous), every byte checked in both directions, then
// collectives (Bcast, Allreduce, Alltoall) with their results checked.  Prints
// "mpi: ok rank R of N" on success; on the first mismatch prints "mpi: FAIL ..." and aborts.
//
//   mpi [-n ITERS] [-m MAXSIZE]
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, nranks;

#define CHECK(cond, ...)                                                          \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "mpi: FAIL rank %d: ", rank);             \
			fprintf(stderr, __VA_ARGS__);                             \
			fprintf(stderr, "\n");                                    \
			MPI_Abort(MPI_COMM_WORLD, 1);                             \
		}                                                                 \
	} while (0)

static uint8_t pattern(int from, int iter, size_t i)
{
	return (uint8_t)(from * 131 + iter * 31 + i * 7 + (i >> 8));
}

static void fill(uint8_t *b, size_t n, int from, int iter)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pattern(from, iter, i);
}

static void check(const uint8_t *b, size_t n, int from, int iter, const char *what)
{
	for (size_t i = 0; i < n; i++)
		CHECK(b[i] == pattern(from, iter, i), "%s: size %zu iter %d: byte %zu is %u, expected %u",
		      what, n, iter, i, b[i], pattern(from, iter, i));
}

/* Receives message `it` of n bytes from rank `from` and checks its length and bytes. */
static void recv_checked(uint8_t *r, size_t n, int from, int it, const char *what)
{
	MPI_Status st;
	int got;

	MPI_Recv(r, (int)n, MPI_BYTE, from, it, MPI_COMM_WORLD, &st);
	MPI_Get_count(&st, MPI_BYTE, &got);
	CHECK((size_t)got == n, "%s of %zu bytes came with %d", what, n, got);
	check(r, n, from, it, what);
}

static void pingpong(int iters, size_t max)
{
	uint8_t *s = malloc(max), *r = malloc(max);
	CHECK(s && r, "malloc");
	for (size_t n = 1; n <= max; n *= 4) {
		double t0 = MPI_Wtime();
		for (int it = 0; it < iters; it++) {
			memset(r, 0, n);
			if (rank == 0) {
				fill(s, n, 0, it);
				MPI_Send(s, (int)n, MPI_BYTE, 1, it, MPI_COMM_WORLD);
				recv_checked(r, n, 1, it, "pong");
			} else if (rank == 1) {
				recv_checked(r, n, 0, it, "ping");
				fill(s, n, 1, it);
				MPI_Send(s, (int)n, MPI_BYTE, 0, it, MPI_COMM_WORLD);
			}
		}
		if (rank == 0)
			printf("mpi: pingpong %8zu bytes x %d: %.1f us per round trip\n", n, iters,
			       (MPI_Wtime() - t0) * 1e6 / iters);
		if (n * 4 > max && n != max)
			n = max / 4;	// end on max itself
	}
	free(s);
	free(r);
}

static void collectives(int iters)
{
	enum { N = 4096 };
	static int64_t a[N], b[N];
	static uint8_t big[1 << 20];
	for (int it = 0; it < iters; it++) {
		// Bcast from a rotating root, 1 MiB (rendezvous) and small.
		int root = it % nranks;
		size_t sz = it & 1 ? sizeof(big) : 100;
		if (rank == root)
			fill(big, sz, root, it);
		else
			memset(big, 0, sz);
		MPI_Bcast(big, (int)sz, MPI_BYTE, root, MPI_COMM_WORLD);
		check(big, sz, root, it, "bcast");

		// Allreduce: sum over ranks of (rank + 1) * (i + it).
		for (int i = 0; i < N; i++)
			a[i] = (int64_t)(rank + 1) * (i + it);
		MPI_Allreduce(a, b, N, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
		int64_t ranks_sum = (int64_t)nranks * (nranks + 1) / 2;
		for (int i = 0; i < N; i++)
			CHECK(b[i] == ranks_sum * (i + it), "allreduce iter %d: [%d] is %lld, expected %lld", it, i,
			      (long long)b[i], (long long)(ranks_sum * (i + it)));

		// Alltoall: block j of rank r's send buffer goes to rank j.
		int per = N / nranks;
		for (int j = 0; j < nranks; j++)
			for (int i = 0; i < per; i++)
				a[j * per + i] = ((int64_t)rank << 40) | ((int64_t)j << 20) | (i + it);
		MPI_Alltoall(a, per, MPI_INT64_T, b, per, MPI_INT64_T, MPI_COMM_WORLD);
		for (int j = 0; j < nranks; j++)
			for (int i = 0; i < per; i++) {
				int64_t want = ((int64_t)j << 40) | ((int64_t)rank << 20) | (i + it);
				CHECK(b[j * per + i] == want, "alltoall iter %d: from %d [%d] is %llx, expected %llx", it, j,
				      i, (long long)b[j * per + i], (long long)want);
			}
	}
	MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
	int iters = 20, c;
	size_t max = 1 << 20;
	setvbuf(stdout, NULL, _IOLBF, 0);	// mpirun's pipe: a rank that dies keeps its lines
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	while ((c = getopt(argc, argv, "n:m:")) != -1) {
		switch (c) {
		case 'n': iters = atoi(optarg); break;
		case 'm': max = strtoul(optarg, NULL, 0); break;
		default: CHECK(0, "usage: mpi [-n ITERS] [-m MAXSIZE]");
		}
	}
	char host[256] = "";
	gethostname(host, sizeof(host));
	int len;
	char lib[MPI_MAX_LIBRARY_VERSION_STRING];
	MPI_Get_library_version(lib, &len);
	if (rank == 0)
		printf("mpi: %d ranks, %.60s\n", nranks, lib);
	CHECK(nranks >= 2, "needs at least 2 ranks");
	pingpong(iters, max);
	if (rank == 0)
		printf("mpi: pingpong checked\n");
	collectives(iters);
	if (rank == 0)
		printf("mpi: collectives checked\n");
	printf("mpi: ok rank %d of %d\n", rank, nranks);
	MPI_Finalize();
	return 0;
}
