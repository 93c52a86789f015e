/* A fake libnccl.so.2 exporting NCCL's real signatures, for the uprobe tests.
 *
 * It moves no data. What matters is that the functions exist with NCCL's argument layout
 * (so the uprobes decode the same registers and stack slots as on the real library), and
 * that a test can make one ncclAllReduce block: with FAKE_NCCL_BLOCK_FIFO=<path> set, the
 * FAKE_NCCL_BLOCK_CALL-th ncclAllReduce (1-based) reads one byte from that FIFO first.
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "nccl.h"

/* The communicator as NCCL 2.28.9 lays out the parts an exporter reads (src/include/
 * comm.h; offsets from bench/results/nccl_counters.md): the identity fields together, a
 * megabyte into the struct, after the channels, and the per-function counts of launched
 * collectives (seqNumber) further on. The accessors below read them as NCCL's do, and
 * ncclGetVersion says 2.28.9, so the layout and the counter are found the same way.
 * FAKE_NCCL_VERSION_CODE (a -D at build time) makes it another release. */
#define RANK_AT 0x1044d0
#define SEQ_NUMBER_AT 0x106a10
#ifndef FAKE_NCCL_VERSION_CODE
#define FAKE_NCCL_VERSION_CODE 22809
#endif
enum { FUNC_BROADCAST, FUNC_REDUCE, FUNC_ALLGATHER, FUNC_REDUCESCATTER, FUNC_ALLREDUCE, NUM_FUNCTIONS };

struct ncclComm {
	uint64_t startMagic;
	char before[RANK_AT - 24];  /* memory stacks, channels, peer info, ... */
	uint64_t magic;
	uint64_t commHash;
	int rank;
	int nRanks;
	int cudaDev;
	int nvmlDev;
	int compCap;
	int minCompCap, maxCompCap;
	int64_t busId;
	char between[SEQ_NUMBER_AT - RANK_AT - 40];
	uint64_t seqNumber[NUM_FUNCTIONS];   /* NCCL counts each launched collective here */
	uint64_t endMagic;
};
_Static_assert(offsetof(struct ncclComm, rank) == RANK_AT, "rank where NCCL 2.28.9 has it");
_Static_assert(offsetof(struct ncclComm, seqNumber) == SEQ_NUMBER_AT, "seqNumber where NCCL 2.28.9 has it");

/* Collectives called inside ncclGroupStart/End are launched at the group's end, as NCCL
 * does: only then are they counted. */
static __thread int group_depth;
static __thread struct { ncclComm_t comm; int func; } grouped[256];
static __thread int ngrouped;

static void launched(ncclComm_t comm, int func)
{
	if (group_depth && ngrouped < 256) {
		grouped[ngrouped].comm = comm;
		grouped[ngrouped++].func = func;
		return;
	}
	__atomic_fetch_add(&comm->seqNumber[func], 1, __ATOMIC_RELAXED);
}

ncclResult_t ncclGroupStart(void)
{
	group_depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
	if (group_depth > 0 && --group_depth == 0) {
		for (int i = 0; i < ngrouped; i++)
			__atomic_fetch_add(&grouped[i].comm->seqNumber[grouped[i].func], 1, __ATOMIC_RELAXED);
		ngrouped = 0;
	}
	return ncclSuccess;
}

ncclResult_t ncclGetVersion(int *version)
{
	if (!version)
		return ncclInvalidArgument;
	*version = FAKE_NCCL_VERSION_CODE;
	return ncclSuccess;
}

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
	launched(comm, FUNC_ALLREDUCE);
	return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
			   ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)sendcount; (void)datatype; (void)stream;
	fake_nccl_last_op = 2;
	if (!comm)
		return ncclInvalidArgument;
	launched(comm, FUNC_ALLGATHER);
	return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
			       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)recvcount; (void)datatype; (void)op; (void)stream;
	fake_nccl_last_op = 3;
	if (!comm)
		return ncclInvalidArgument;
	launched(comm, FUNC_REDUCESCATTER);
	return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			   ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)root; (void)stream;
	fake_nccl_last_op = 4;
	if (!comm)
		return ncclInvalidArgument;
	launched(comm, FUNC_BROADCAST);
	return ncclSuccess;
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
		       cudaStream_t stream)
{
	(void)buff; (void)count; (void)datatype; (void)root; (void)stream;
	fake_nccl_last_op = 5;
	if (!comm)
		return ncclInvalidArgument;
	launched(comm, FUNC_BROADCAST);
	return ncclSuccess;
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	(void)sendbuff; (void)recvbuff; (void)count; (void)datatype; (void)op; (void)root; (void)stream;
	fake_nccl_last_op = 6;
	if (!comm)
		return ncclInvalidArgument;
	launched(comm, FUNC_REDUCE);
	return ncclSuccess;
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
