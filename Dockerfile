# The xdpq image: the node daemon (cmd/deviceplugin, the entrypoint), the
# CNI plugin (copied onto the host's CNI bin directory by the chart's init
# container, xdpq-install-cni: there is no shell or cp), xdpqctl and
# xdpqperf. Static binaries on an empty base, for
# linux/amd64 and linux/arm64:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t xdpq.io/xdpq:dev .
#
# Where there is no Docker, `make image` builds the same image (files,
# paths, entrypoint, user, labels, env) with go-containerregistry
# (internal/tools/image); internal/tools/image's tests fail when the two differ.

ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0 GOOS=linux GOARCH=${TARGETARCH}
RUN go build -trimpath -ldflags='-s -w' -o /out/xdpq-deviceplugin ./cmd/deviceplugin
RUN go build -trimpath -ldflags='-s -w' -o /out/xdpq-cni ./cmd/cni
RUN go build -trimpath -ldflags='-s -w' -o /out/xdpqctl ./cmd/xdpqctl
RUN go build -trimpath -ldflags='-s -w' -o /out/xdpqperf ./cmd/xdpqperf
RUN go build -trimpath -ldflags='-s -w' -o /out/xdpq-install-cni ./cmd/xdpq-install-cni

FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
COPY --from=build /out/xdpq-deviceplugin /usr/local/bin/xdpq-deviceplugin
COPY --from=build /out/xdpq-cni /opt/xdpq/cni/xdpq
COPY --from=build /out/xdpqctl /usr/local/bin/xdpqctl
COPY --from=build /out/xdpqperf /usr/local/bin/xdpqperf
COPY --from=build /out/xdpq-install-cni /usr/local/bin/xdpq-install-cni
LABEL org.opencontainers.image.title="xdpq" \
      org.opencontainers.image.description="NIC queues for Kubernetes pods as AF_XDP sockets: the node daemon, the CNI plugin, xdpqctl and xdpqperf" \
      org.opencontainers.image.source="https://github.com/xdpq/xdpq" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
ENV PATH=/usr/local/bin
WORKDIR /
# The daemon runs as root: it attaches XDP programs, pins maps, binds
# AF_XDP sockets and enters pods' network namespaces. Run it with the
# capabilities it needs added to an unprivileged container (the chart
# lists them), not as a privileged one.
USER 0:0
ENTRYPOINT ["/usr/local/bin/xdpq-deviceplugin"]
