# reshape in a container, in two stages. The build stage runs `make venv`: the same pinned install
# as `make run` and CI (tests/unit/test_packaging.py keeps them together). The image gets only the
# virtualenv and the package, never tests/, bench/ or the build tools.
#
#   docker build -t reshape .
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9464:9464 \
#     -v reshape-ca:/home/reshape/.reshape reshape
#
# Configure it with the RESHAPE_* variables below (docker run -e …); the health check reads the
# same RESHAPE_ADMIN, so it follows the admin port wherever it is moved. No Docker engine runs
# where this repository is tested: tests/system/test_deploy_checks.py lints this file with
# hadolint and checks its stages, environment and health check against `reshape run`.

FROM python:3.12-slim AS build
# make comes from the base image's Debian release; its exact version does not matter here.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY Makefile pyproject.toml requirements.lock .python-version README.md ./
COPY reshape ./reshape
RUN make venv PYTHON=python3.12

FROM python:3.12-slim
# The CA lives in a volume so it survives container restarts (and is never baked into the
# image); the directory exists, owned by reshape, so a new volume is created with that owner.
RUN groupadd --gid 10001 reshape \
 && useradd --create-home --uid 10001 --gid 10001 reshape \
 && install -d -m 0700 -o reshape -g reshape /home/reshape/.reshape
WORKDIR /app
# The virtualenv's editable install points at /app/reshape: both keep the build stage's paths.
COPY --from=build /app/.venv /app/.venv
COPY --from=build /app/reshape /app/reshape
# Listening on all interfaces needs an allow-list (never an open proxy): private networks here;
# narrow it with -e RESHAPE_ALLOW_CLIENTS=CIDR[,CIDR…] or require users (run --users FILE).
ENV PATH=/app/.venv/bin:$PATH \
    RESHAPE_LISTEN=0.0.0.0:8080 \
    RESHAPE_ADMIN=0.0.0.0:9464 \
    RESHAPE_CONFDIR=/home/reshape/.reshape \
    RESHAPE_ALLOW_CLIENTS=10.0.0.0/8,172.16.0.0/12,192.168.0.0/16 \
    RESHAPE_LOG_FORMAT=json
# Numeric, so a runtime (Kubernetes runAsNonRoot) can tell it is not root: the user above.
USER 10001:10001
VOLUME ["/home/reshape/.reshape"]
EXPOSE 8080 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["reshape", "health"]
ENTRYPOINT ["reshape"]
CMD ["run"]
