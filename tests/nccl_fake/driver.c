/* Test driver linked against the fake libnccl: a "rank" of a known communicator.
 *
 * usage: driver NRANKS RANK N_ALLREDUCE ALLREDUCE_COUNT N_ALLGATHER ALLGATHER_COUNT
 * Prints "ready" and waits for a line on stdin before initialising (so the test can
 * attach first), runs the calls (then a split communicator with one AllReduce), prints
 * "done", waits for another line, destroys the communicator and exits. The unique id is ncclGetUniqueId's fixed pattern.
 * With FAKE_NCCL_BLOCK_FIFO/FAKE_NCCL_BLOCK_CALL set, one ncclAllReduce blocks inside
 * the library until the test writes to the FIFO.
 */
#include <stdio.h>
#include <stdlib.h>
#include "nccl.h"

static void wait_line(void)
{
	char line[64];

	if (!fgets(line, sizeof(line), stdin))
		exit(3);
}

int main(int argc, char **argv)
{
	ncclUniqueId id;
	ncclComm_t comm;
	static float fbuf[1 << 16];
	static char cbuf[1 << 16];

	if (argc != 7) {
		fprintf(stderr, "usage: %s NRANKS RANK N_ALLREDUCE COUNT N_ALLGATHER COUNT\n", argv[0]);
		return 2;
	}
	int nranks = atoi(argv[1]), rank = atoi(argv[2]);
	long n_allreduce = atol(argv[3]), n_allgather = atol(argv[5]);
	size_t allreduce_count = strtoull(argv[4], NULL, 10), allgather_count = strtoull(argv[6], NULL, 10);

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	wait_line();
	ncclGetUniqueId(&id);
	if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess)
		return 4;
	for (long i = 0; i < n_allreduce; i++)
		ncclAllReduce(fbuf, fbuf, allreduce_count, ncclFloat32, ncclSum, comm, NULL);
	for (long i = 0; i < n_allgather; i++)
		ncclAllGather(cbuf, cbuf, allgather_count, ncclInt8, comm, NULL);
	ncclReduce(fbuf, fbuf, 10, ncclFloat64, ncclSum, 0, comm, NULL);
	ncclBroadcast(fbuf, fbuf, 3, ncclBfloat16, 0, comm, NULL);
	/* A split communicator (color 7, key = rank) with one small AllReduce of its own, kept
	 * to the end: the exporter reads it after its init event, and a freed comm of NCCL's
	 * size (a megabyte: mmap'd) is unmapped at once. */
	ncclComm_t sub;
	if (ncclCommSplit(comm, 7, rank, &sub, NULL) != ncclSuccess)
		return 5;
	ncclAllReduce(fbuf, fbuf, 3, ncclFloat32, ncclSum, sub, NULL);
	ncclSend(fbuf, 5, ncclInt64, (rank + 1) % nranks, comm, NULL);
	ncclRecv(fbuf, 5, ncclInt64, (rank + nranks - 1) % nranks, comm, NULL);
	printf("done\n");
	wait_line();
	ncclCommDestroy(sub);
	ncclCommDestroy(comm);
	return 0;
}
