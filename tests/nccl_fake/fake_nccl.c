/* A fake libnccl.so.2 exporting NCCL's real signatures, for the uprobe tests.
 *
 * It moves no data. What matters is that the functions exist with NCCL's argument layout
 * (so the uprobes decode the same registers and stack slots as on the real library), and
 * that a test can make one ncclAllReduce block: with FAKE_NCCL_BLOCK_FIFO=<path> set, the
 * FAKE_NCCL_BLOCK_CALL-th ncclAllReduce (1-based) reads one byte from that FIFO first.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "nccl.h"

/* The communicator as NCCL 2.18-2.28 lays out the part an exporter reads (src/include/
 * comm.h): the identity fields together, kilobytes into the struct, after the channels.
 * The accessors below read them as NCCL's do, so the layout is found the same way. */
struct ncclComm {
	uint64_t startMagic;
	char before[9000];          /* memory stacks, channels, peer info, ... */
	uint64_t magic;
	uint64_t commHash;
	int rank;
	int nRanks;
	int cudaDev;
	int nvmlDev;
	int compCap;
	int minCompCap, maxCompCap;
	int64_t busId;
	uint64_t endMagic;
};

#define FAKE_NCCL_MAGIC 0x0280028002800280ULL

static int allreduce_calls;
/* Keeps the compiler from folding the trivial bodies into one another (identical code
 * folding would give two symbols one address, and one uprobe would fire for both). */
volatile int fake_nccl_last_op;

/* NCCL 2.18's getHash (DJB2a over signed chars): the comm's id, commHash. */
static uint64_t get_hash(const char *bytes, int n)
{
	uint64_t result = 5381;

	for (int c = 0; c < n; c++)
		result = ((result << 5) + result) ^ (uint64_t)(int64_t)bytes[c];
	return result;
}

/* FAKE_NCCL_CUDA_DEV (a number) is the device every comm of the process is on; else the rank. */
static ncclComm_t new_comm(int rank, int nranks, uint64_t hash)
{
	const char *dev = getenv("FAKE_NCCL_CUDA_DEV");
	ncclComm_t comm = calloc(1, sizeof(*comm));

	if (!comm)
		return NULL;
	comm->startMagic = comm->endMagic = FAKE_NCCL_MAGIC;
	comm->commHash = hash;
	comm->rank = rank;
	comm->nRanks = nranks;
	comm->cudaDev = dev ? atoi(dev) : rank;
	comm->nvmlDev = comm->cudaDev;
	comm->compCap = comm->minCompCap = comm->maxCompCap = 90;
	comm->busId = 0x18000 + comm->cudaDev * 0x1000;
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
	*comm = new_comm(rank, nranks, get_hash(commId.internal, NCCL_UNIQUE_ID_BYTES));
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
	ncclUniqueId id;

	(void)devlist;
	ncclGetUniqueId(&id);           /* as NCCL does: one fresh id for the clique */
	for (int i = 0; i < ndev; i++)
		comm[i] = new_comm(i, ndev, get_hash(id.internal, NCCL_UNIQUE_ID_BYTES) ^ 0xa11);
	return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
	/* NCCL derives the child's hash from the parent's and the color; the key orders the
	 * ranks of the new comm (here: the key is the rank). */
	struct { uint64_t parent; int color; } seed = { comm->commHash, color };

	(void)config;
	*newcomm = new_comm(key, comm->nRanks, get_hash((const char *)&seed, 12));
	return *newcomm ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	free(comm);
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { *count = comm->nRanks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { *rank = comm->rank; return ncclSuccess; }
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *devid) { *devid = comm->cudaDev; return ncclSuccess; }

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
