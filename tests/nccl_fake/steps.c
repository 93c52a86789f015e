/* A data-parallel "training loop" rank over the fake libnccl: the shape of a real job.
 *
 * usage: steps NRANKS RANK NSTEPS DELAY_US STOP_AT BARRIER_FILE
 * Each step: (this rank only) sleep DELAY_US, ncclAllReduce, then wait at a barrier shared
 * by all ranks (a file of at least 8 zero bytes). The barrier stands for the stream
 * synchronisation a real step ends with (loss.item()): like real NCCL, the fake
 * ncclAllReduce returns at once and the ranks wait for each other *outside* the library.
 * So every rank has the same period, and a late rank shows only in when it enters.
 * With FAKE_STEPS_SECOND_US=<us> set, a second, one-float ncclAllReduce follows the first
 * that many microseconds later (a gradient bucket and a stop flag: ops unevenly spaced).
 * STOP_AT > 0: before step STOP_AT (1-based) the rank prints "stopped" and waits for a
 * line on stdin, while its peers wait at the barrier. Prints "ready", waits for a line,
 * runs, prints "done", waits for a line and exits.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "nccl.h"

struct barrier { unsigned int arrived; unsigned int generation; };

static void wait_line(void)
{
	char line[64];

	if (!fgets(line, sizeof(line), stdin))
		exit(3);
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	while (nanosleep(&ts, &ts))
		;
}

/* Sense-reversing barrier in shared memory: the last arrival starts a new generation. */
static void barrier_wait(struct barrier *b, unsigned int n)
{
	unsigned int generation = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);

	if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == n) {
		__atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
		__atomic_add_fetch(&b->generation, 1, __ATOMIC_RELEASE);
		return;
	}
	while (__atomic_load_n(&b->generation, __ATOMIC_ACQUIRE) == generation)
		sleep_us(50);
}

int main(int argc, char **argv)
{
	static float grad[1 << 12];
	ncclUniqueId id;
	ncclComm_t comm;

	if (argc != 7) {
		fprintf(stderr, "usage: %s NRANKS RANK NSTEPS DELAY_US STOP_AT BARRIER_FILE\n", argv[0]);
		return 2;
	}
	int nranks = atoi(argv[1]), rank = atoi(argv[2]);
	long nsteps = atol(argv[3]), delay_us = atol(argv[4]), stop_at = atol(argv[5]);
	const char *second = getenv("FAKE_STEPS_SECOND_US");
	long second_us = second ? atol(second) : -1;
	int fd = open(argv[6], O_RDWR);
	struct barrier *b = fd < 0 ? MAP_FAILED : mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (b == MAP_FAILED) {
		perror(argv[6]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	wait_line();
	ncclGetUniqueId(&id);
	if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess)
		return 4;
	barrier_wait(b, nranks);                    /* everyone initialised: start together */
	for (long step = 1; step <= nsteps; step++) {
		if (step == stop_at) {
			printf("stopped\n");
			wait_line();
		}
		sleep_us(1000);                     /* "compute": the same on every rank */
		if (delay_us)
			sleep_us(delay_us);
		ncclAllReduce(grad, grad, sizeof(grad) / sizeof(grad[0]), ncclFloat32, ncclSum, comm, NULL);
		if (second_us >= 0) {
			sleep_us(second_us);
			ncclAllReduce(grad, grad, 1, ncclFloat32, ncclSum, comm, NULL);
		}
		barrier_wait(b, nranks);
	}
	printf("done\n");
	wait_line();
	ncclCommDestroy(comm);
	return 0;
}
