// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The floor of a user-space data path: the waiting patterns of lat.c in which
 * the target application makes no call (mem-write, sleep-read, busy-read),
 * served the way any provider whose data path runs in user space must serve
 * them, with the protocol taken out. Each frame is one UDP datagram, received
 * in the softirq of its arrival like a frame on the direct path's packet
 * socket; a thread of the receiving process blocked in recv() (the role of
 * urdma's helper) is woken to "place" it (a store into memory the application
 * spins on) or to answer it (a Read Response). No RDMA device is used.
 *
 *   floor server ADDR PORT -p PATTERN [-w block|spin] [-n ITERS] [-t SECONDS]
 *   floor client ADDR PORT -p PATTERN [-w block|spin] [-n ITERS] [-t SECONDS]
 *
 * -w spin: the helper never sleeps; it polls its socket without blocking and
 * yields the CPU between polls, the other way a user-space data path can wait
 * (at the cost of a core while nothing comes). Both sides must be given the
 * same -p, -w and -n. Patterns, as in lat.c:
 *   mem-write   ping-pong; each side's application spins on a word that its
 *               helper stores when the peer's datagram arrives, then sends
 *   sleep-read  the client sends and busy-polls its socket for the answer; the
 *               server's application sleeps, its helper answers
 *   busy-read   as sleep-read, the server's application computing meanwhile
 *
 * The client prints one line at the end, timed as lat.c times the pattern:
 *   floor pattern=P wait=W iters=N typical_us=X p99_us=Y avg_us=Z
 * (mem-write: half a round trip; the others: the whole exchange). What lat.c
 * measures for a stack, minus this, is that stack's own cost; what rxe and siw
 * measure below this, no user-space design reaches on the same machine, since
 * they serve the frame in the softirq that received it with no thread woken.
 * Bad arguments: a usage line, exit 2; any failure or the -t bound (default
 * 60 s) reached: "FAIL ..." and exit 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#define USAGE "usage: floor server|client ADDR PORT -p mem-write|sleep-read|busy-read " \
	      "[-w block|spin] [-n ITERS] [-t SECONDS]"
#define WARMUP 10
#define STOP UINT32_MAX

enum pattern { MEM_WRITE, SLEEP_READ, BUSY_READ };
static const char *const pattern_names[] = { "mem-write", "sleep-read", "busy-read" };

static int sock;
static enum pattern pattern;
static int server;
static int spin;
/* What the helper placed: the sequence number of the peer's last datagram. */
static uint32_t placed;
static volatile int stopping;

static void fail(const char *fmt, ...)
{
	va_list ap;

	fputs("FAIL ", stdout);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	exit(1);
}

static void on_alarm(int sig)
{
	static const char msg[] = "FAIL time bound reached\n";

	(void)sig;
	if (write(1, msg, sizeof(msg) - 1) < 0)
		_exit(1);
	_exit(1);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void send_seq(uint32_t seq)
{
	if (send(sock, &seq, sizeof(seq), 0) != sizeof(seq))
		fail("send: %s", strerror(errno));
}

static uint32_t recv_seq(int flags)
{
	uint32_t seq;
	ssize_t n = recv(sock, &seq, sizeof(seq), flags);

	if (n < 0 && (flags & MSG_DONTWAIT) && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (n != sizeof(seq))
		fail("recv: %s", n < 0 ? strerror(errno) : "short datagram");
	return seq;
}

/* The helper: woken for every datagram, it places or answers it. */
static void *helper(void *arg)
{
	(void)arg;
	for (;;) {
		uint32_t seq = recv_seq(spin ? MSG_DONTWAIT : 0);

		if (seq == 0) {
			/* nothing yet (spin), or a stray greeting */
			if (spin)
				sched_yield();
			continue;
		}
		if (seq == STOP) {
			stopping = 1;
			__atomic_store_n(&placed, STOP, __ATOMIC_RELEASE);
			return NULL;
		}
		if (pattern == MEM_WRITE)
			__atomic_store_n(&placed, seq, __ATOMIC_RELEASE);
		else
			send_seq(seq);
	}
}

static void spin_until(uint32_t seq)
{
	uint32_t v;

	while ((v = __atomic_load_n(&placed, __ATOMIC_ACQUIRE)) != seq)
		if (v == STOP)
			fail("the peer stopped early");
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void run_client(int iters)
{
	double *t = calloc(iters, sizeof(*t)), sum = 0;
	uint32_t seq;

	if (!t)
		fail("out of memory");
	/* marks the exchange in a scheduler trace (scripts/trace-wakes) */
	prctl(PR_SET_NAME, "floor-exchange");
	for (seq = 1; seq <= (uint32_t)(iters + WARMUP); seq++) {
		double start = now_us();

		send_seq(seq);
		if (pattern == MEM_WRITE) {
			spin_until(seq);
		} else {
			uint32_t got;

			while ((got = recv_seq(MSG_DONTWAIT)) == 0)
				;
			if (got != seq)
				fail("answer %u to request %u", got, seq);
		}
		if (seq > WARMUP) {
			double d = now_us() - start;

			t[seq - WARMUP - 1] = pattern == MEM_WRITE ? d / 2 : d;
		}
	}
	send_seq(STOP);
	for (int i = 0; i < iters; i++)
		sum += t[i];
	qsort(t, iters, sizeof(*t), cmp_double);
	printf("floor pattern=%s wait=%s iters=%d typical_us=%.1f p99_us=%.1f avg_us=%.1f\n",
	       pattern_names[pattern], spin ? "spin" : "block", iters, t[iters / 2], t[(iters * 99) / 100],
	       sum / iters);
	free(t);
}

static void run_server(void)
{
	volatile uint64_t work = 0;

	prctl(PR_SET_NAME, "floor-exchange");
	switch (pattern) {
	case MEM_WRITE:
		for (uint32_t seq = 1;; seq++) {
			uint32_t v;

			while ((v = __atomic_load_n(&placed, __ATOMIC_ACQUIRE)) != seq)
				if (v == STOP)
					return;
			send_seq(seq);
		}
	case SLEEP_READ:
		return; /* main sleeps in pthread_join */
	case BUSY_READ:
		while (!stopping)
			work++;
		return;
	}
}

int main(int argc, char **argv)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM };
	struct addrinfo *ai;
	int iters = 1000, seconds = 60, opt, p = -1;
	pthread_t tid;

	if (argc < 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "%s\n", USAGE);
		return 2;
	}
	server = !strcmp(argv[1], "server");
	optind = 4;
	while ((opt = getopt(argc, argv, "p:w:n:t:")) != -1) {
		switch (opt) {
		case 'p':
			for (int i = 0; i < 3; i++)
				if (!strcmp(optarg, pattern_names[i]))
					p = i;
			break;
		case 'w':
			if (strcmp(optarg, "block") && strcmp(optarg, "spin")) {
				fprintf(stderr, "%s\n", USAGE);
				return 2;
			}
			spin = !strcmp(optarg, "spin");
			break;
		case 'n':
			iters = atoi(optarg);
			break;
		case 't':
			seconds = atoi(optarg);
			break;
		default:
			fprintf(stderr, "%s\n", USAGE);
			return 2;
		}
	}
	if (p < 0 || iters < 1 || seconds < 1 || optind != argc) {
		fprintf(stderr, "%s\n", USAGE);
		return 2;
	}
	pattern = p;
	signal(SIGALRM, on_alarm);
	alarm(seconds);

	if (getaddrinfo(argv[2], argv[3], &hints, &ai))
		fail("cannot resolve %s port %s", argv[2], argv[3]);
	sock = socket(ai->ai_family, SOCK_DGRAM, 0);
	if (sock < 0)
		fail("socket: %s", strerror(errno));
	if (server) {
		struct sockaddr_storage peer;
		socklen_t len = sizeof(peer);
		uint32_t hello;

		if (bind(sock, ai->ai_addr, ai->ai_addrlen))
			fail("bind: %s", strerror(errno));
		if (recvfrom(sock, &hello, sizeof(hello), 0, (struct sockaddr *)&peer, &len) < 0 ||
		    connect(sock, (struct sockaddr *)&peer, len))
			fail("first datagram: %s", strerror(errno));
		send_seq(0);
	} else {
		/* The server may not be bound yet: greet until it answers. */
		if (connect(sock, ai->ai_addr, ai->ai_addrlen))
			fail("connect: %s", strerror(errno));
		for (;;) {
			struct pollfd pfd = { .fd = sock, .events = POLLIN };

			send(sock, &(uint32_t){ 0 }, sizeof(uint32_t), 0);
			if (poll(&pfd, 1, 100) == 1 && recv(sock, &(uint32_t){ 0 }, 4, 0) == 4)
				break;
		}
	}
	freeaddrinfo(ai);

	/* The client's own polling takes its answers in sleep-read and busy-read. */
	if ((server || pattern == MEM_WRITE) && pthread_create(&tid, NULL, helper, NULL))
		fail("pthread_create");
	if (server) {
		run_server();
		pthread_join(tid, NULL);
		printf("floor server done\n");
	} else {
		run_client(iters);
	}
	return 0;
}
