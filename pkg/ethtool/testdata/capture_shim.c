// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * LD_PRELOAD shim for capture.sh: records the struct that ethtool passes
 * to SIOCETHTOOL for ETHTOOL_SRXCLSRLINS (ntuple insert) and
 * ETHTOOL_SRSSH (RSS context), as hex, into $XDPQ_CAPTURE. For -X it
 * answers the reads ethtool makes first as an 8-ring NIC with a 128-entry
 * indirection table and a 40-byte key would, since no virtual device has
 * RSS; everything else goes to the kernel.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>

static void dump(const void *p, size_t n)
{
	FILE *f = fopen(getenv("XDPQ_CAPTURE"), "w");
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		fprintf(f, "%02x%s", b[i], (i % 16 == 15) ? "\n" : "");
	if (n % 16)
		fprintf(f, "\n");
	fclose(f);
}

int ioctl(int fd, unsigned long req, ...)
{
	static int (*real)(int, unsigned long, void *);
	va_list ap;
	void *arg;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real)
		real = dlsym(RTLD_NEXT, "ioctl");
	if (req == SIOCETHTOOL) {
		struct ifreq *ifr = arg;
		__u32 cmd = *(__u32 *)ifr->ifr_data;

		switch (cmd) {
		case ETHTOOL_SRXCLSRLINS:
			dump(ifr->ifr_data, sizeof(struct ethtool_rxnfc));
			break;
		case ETHTOOL_GRXRINGS:
			((struct ethtool_rxnfc *)ifr->ifr_data)->data = 8;
			return 0;
		case ETHTOOL_GRSSH: {
			struct ethtool_rxfh *rxfh = (void *)ifr->ifr_data;

			if (rxfh->indir_size == 0 && rxfh->key_size == 0) {
				rxfh->indir_size = 128;
				rxfh->key_size = 40;
			} else {
				memset(rxfh->rss_config, 0, rxfh->indir_size * 4 + rxfh->key_size);
			}
			rxfh->hfunc = 1;
			return 0;
		}
		case ETHTOOL_SRSSH: {
			struct ethtool_rxfh *rxfh = (void *)ifr->ifr_data;

			dump(rxfh, sizeof(*rxfh) + rxfh->indir_size * 4 + rxfh->key_size);
			errno = EOPNOTSUPP;
			return -1;
		}
		}
	}
	return real(fd, req, arg);
}
