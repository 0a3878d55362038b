/* A conventional DTA collector in C, for `softdta bench`: one UDP socket, epoll, and each report parsed and
 * stored by the CPU (Key-Write into a hash table, Key-Increment counters, Append lists). It reads until it has
 * received argv[1] reports or the sender has been quiet for a second, then prints its CPU time as JSON. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define SLOTS (1u << 20)
#define LISTS 1024

struct slot { uint32_t key; uint32_t value; uint64_t counter; };

static struct slot table[SLOTS];
static uint32_t *lists[LISTS];
static uint32_t list_len[LISTS], list_cap[LISTS];

static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

static struct slot *find(uint32_t key)
{
	uint32_t i = (key * 2654435761u) & (SLOTS - 1);

	while (table[i].key && table[i].key != key)
		i = (i + 1) & (SLOTS - 1);
	table[i].key = key;
	return &table[i];
}

/* dta-v1, 3-byte base header: opcode, seqnum, flags; then the primitive's fields. */
static void store(const uint8_t *p, ssize_t len)
{
	if (len < 3)
		return;
	switch (p[0]) {
	case 1: /* Key-Write: N, key, data */
		if (len >= 12)
			find(get32(p + 4))->value = get32(p + 8);
		break;
	case 3: /* Key-Increment: N, key, counter (64 bits) */
		if (len >= 16)
			find(get32(p + 4))->counter += (uint64_t)get32(p + 8) << 32 | get32(p + 12);
		break;
	case 2: { /* Append: list, data */
		uint32_t list;

		if (len < 11)
			break;
		list = get32(p + 3) % LISTS;
		if (list_len[list] == list_cap[list]) {
			list_cap[list] = list_cap[list] ? 2 * list_cap[list] : 64;
			lists[list] = realloc(lists[list], list_cap[list] * sizeof(uint32_t));
		}
		lists[list][list_len[list]++] = get32(p + 7);
		break;
	}
	}
}

int main(int argc, char **argv)
{
	long expected = argc > 1 ? atol(argv[1]) : 0, received = 0;
	struct sockaddr_in address = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t size = sizeof(address);
	int fd = socket(AF_INET, SOCK_DGRAM, 0), epoll = epoll_create1(0), buffer = 1 << 26;
	struct epoll_event event = { .events = EPOLLIN }, ready;
	struct rusage usage;
	uint8_t packet[2048];

	setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof(buffer));
	bind(fd, (struct sockaddr *)&address, sizeof(address));
	getsockname(fd, (struct sockaddr *)&address, &size);
	printf("%d\n", ntohs(address.sin_port));
	fflush(stdout);
	epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
	while (received < expected && epoll_wait(epoll, &ready, 1, 1000) > 0) {
		ssize_t length;

		while ((length = recv(fd, packet, sizeof(packet), MSG_DONTWAIT)) > 0) {
			store(packet, length);
			received++;
		}
	}
	getrusage(RUSAGE_SELF, &usage);
	printf("{\"received\": %ld, \"cpu_ns\": %lld}\n", received,
	       (long long)(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000000LL +
		       (long long)(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000LL);
	return 0;
}
