package agent

// The operator program the tests load with ip(8) and xdp-loader(8).
//go:generate clang-14 -O2 -Wall -Werror -target bpf -I/usr/include/x86_64-linux-gnu -c testdata/operator.c -o testdata/operator.o
