# Sluice's image for people who build their own: the same image as
# `make image` (which needs no container daemon), built by Docker or Podman:
#
#   docker build -t sluicehq/sluice:dev \
#     --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(git log -1 --format=%cI) .
#
# The build args fill the labels org.opencontainers.image.version,
# .revision and .created (make image sets them from the binaries' module
# version and commit); without them the image says version=dev with an
# empty revision and creation time, so nothing tells which release it is.
#
# One image holds every command in /usr/local/bin; it runs the regional
# service by default, as the non-root user 65532. The CA bundle is Debian's
# ca-certificates package, from the Go build image.

ARG GO_VERSION=1.26
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static binaries without the build machine's paths; -buildvcs=auto stamps
# the commit (shown by --version) when .git is in the build context.
RUN CGO_ENABLED=0 GOOS=linux go build -buildvcs=auto -trimpath -ldflags='-s -w' -o /out/ ./cmd/... \
 && mkdir -p /rootfs/etc/ssl/certs /rootfs/tmp /rootfs/home/nonroot /rootfs/usr/local/bin \
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /rootfs/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' > /rootfs/etc/group \
 && printf 'hosts: files dns\n' > /rootfs/etc/nsswitch.conf \
 && chmod 1777 /rootfs/tmp && chown 65532:65532 /rootfs/home/nonroot && chmod 700 /rootfs/home/nonroot \
 && cp /out/* /rootfs/usr/local/bin/

FROM scratch
ARG VERSION=dev
ARG REVISION=
ARG CREATED=
COPY --from=build /rootfs/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LABEL org.opencontainers.image.title="Sluice" \
      org.opencontainers.image.source="https://github.com/sluicehq/sluice" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
USER 65532:65532
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/regional"]
