# syntax=docker/dockerfile:1.7
#
# capo-rs, the production controller: no simulators, no benchmarks, no demo
# (`--no-default-features`), one static binary on distroless/static, which carries a CA bundle
# and /etc/passwd's `nonroot` (65532), and has no shell.
#
#   docker build -t capo-rs:0.1.0 .        (or: podman build / buildah bud)
#
# Base images are pinned by digest; refresh a pin with `crane digest IMAGE:TAG` and keep the
# tag beside it. `.ci/run` builds the same binary and assembles the runtime stage from it with
# buildah (no registry is reachable there): see "The image" in docs/installation.md. No image
# is published: build it, push it where your cluster pulls from, and name it in your overlay
# or in CAPO_RS_IMAGE.

FROM docker.io/library/rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
ARG TARGETARCH
WORKDIR /src
COPY . .
# glibc linked statically (+crt-static). Name lookups need no NSS: reqwest resolves with
# hickory-dns (Rust), and in a pod kube reaches the API server by KUBERNETES_SERVICE_HOST's
# IP. `--target` keeps the flags off build scripts and proc-macros, which must stay dynamic.
# Not position-independent (relocation-model=static), as `go build` links CAPO's manager:
# a static PIE relocates 1.8 MB of its own tables at every start and keeps them resident
# (4.6 MiB of idle RSS, docs/memory.md). The `image` profile (Cargo.toml) is the release one
# optimised for size, and stripped.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    case "${TARGETARCH:-amd64}" in \
      amd64) target=x86_64-unknown-linux-gnu ;; \
      arm64) target=aarch64-unknown-linux-gnu ;; \
      *) echo "unsupported architecture ${TARGETARCH}" >&2; exit 1 ;; \
    esac \
 && RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --profile image --locked --no-default-features -p capo-rs --target "$target" \
 && install -D -m 0755 "target/$target/image/capo-rs" /out/capo-rs

FROM gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639
COPY --from=build /out/capo-rs /usr/local/bin/capo-rs
USER 65532:65532
# glibc's allocator: two arenas rather than eight per core, and blocks of 128 KiB and more
# (a list page's text) mapped on their own and given back when freed. Peak RSS 62.1 → 55.8
# MiB at 100 clusters (docs/memory.md). Keep in step with .ci/image.
ENV GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/capo-rs"]
CMD ["run"]
