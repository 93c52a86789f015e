/* A fake libnccl.so.2 exporting NCCL's real signatures, for the uprobe tests.
 *
 * It moves no data. What matters is that the functions exist with NCCL's argument layout
 * (so the uprobes decode the same registers and stack slots as on the real library), and
 * that a test can make one ncclAllReduce block: with FAKE_NCCL_BLOCK_FIFO=<path> set, the
 * FAKE_NCCL_BLOCK_CALL-th ncclAllReduce (1-based) reads one byte from that FIFO first.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "nccl.h"

struct ncclComm { int rank; int nranks; ncclUniqueId id; };

static int allreduce_calls;
/* Keeps the compiler from folding the trivial bodies into one another (identical code
 * folding would give two symbols one address, and one uprobe would fire for both). */
volatile int fake_nccl_last_op;

static ncclComm_t new_comm(int rank, int nranks, const ncclUniqueId *id)
{
	ncclComm_t comm = calloc(1, sizeof(*comm));
	if (!comm)
		return NULL;
	comm->rank = rank;
	comm->nranks = nranks;
	if (id)
		memcpy(&comm->id, id, sizeof(*id));
	return comm;
}

/* A fixed pattern, so a test knows the comm id its ranks will report; FAKE_NCCL_ID_SALT
 * (a number) changes byte 100, so jobs running side by side get ids of their own. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
	const char *salt = getenv("FAKE_NCCL_ID_SALT");

	for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
		uniqueId->internal[i] = (char)(i * 37 + 11);
	if (salt)
		uniqueId->internal[100] ^= (char)atoi(salt);
	return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	if (rank < 0 || rank >= nranks)
		return ncclInvalidArgument;
	*comm = new_comm(rank, nranks, &commId);
	return *comm ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config)
{
	(void)config;
	fake_nccl_last_op = 100;
	return ncclCommInitRank(comm, nranks, commId, rank);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
	(void)devlist;
	for (int i = 0; i < ndev; i++)
		comm[i] = new_comm(i, ndev, NULL);
	return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
	(void)config; (void)color;
	*newcomm = new_comm(key, comm->nranks, &comm->id);
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	free(comm);
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { *count = comm->nranks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { *rank = comm->rank; return ncclSuccess; }

static void maybe_block(void)
{
	const char *fifo = getenv("FAKE_NCCL_BLOCK_FIFO");
	const char *which = getenv("FAKE_NCCL_BLOCK_CALL");
	char byte;
	int fd;

	if (!fifo || !which || allreduce_calls != atoi(which))
		return;
	fd = open(fifo, O_RDONLY);          /* blocks until the test opens it for writing */
	if (fd >= 0) {
		while (read(fd, &byte, 1) == 0)
			;                           /* writer not there yet */
		close(fd);
	}
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)op; (void)stream;
	if (!comm)
		return ncclInvalidArgument;
	allreduce_calls++;
	fake_nccl_last_op = 1;
	maybe_block();
	return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
			   ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)sendcount; (void)datatype; (void)stream;
	fake_nccl_last_op = 2;
	return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
			       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)recvcount; (void)datatype; (void)op; (void)stream;
	fake_nccl_last_op = 3;
	return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			   ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)root; (void)stream;
	fake_nccl_last_op = 4;
	return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
		       cudaStream_t stream)
{
	(void)buff; (void)count; (void)datatype; (void)root; (void)stream;
	fake_nccl_last_op = 5;
	return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)op; (void)root; (void)stream;
	fake_nccl_last_op = 6;
	return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
		      cudaStream_t stream)
{
	(void)sendbuff; (void)count; (void)datatype; (void)peer; (void)stream;
	fake_nccl_last_op = 7;
	return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
		      cudaStream_t stream)
{
	(void)recvbuff; (void)count; (void)datatype; (void)peer; (void)stream;
	fake_nccl_last_op = 8;
	return comm ? ncclSuccess : ncclInvalidArgument;
}
