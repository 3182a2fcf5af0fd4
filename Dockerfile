# reshape in a container. The install is `make venv` itself, so it is the same pinned install that
# `make run` and CI use (tests/test_packaging.py checks the two cannot drift apart).
FROM python:3.12-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 reshape
WORKDIR /app
COPY --chown=reshape:reshape . /app
USER reshape
RUN make venv PYTHON=python3.12

# The CA lives in a volume so it survives container restarts (and is never baked into the image).
VOLUME ["/home/reshape/.reshape"]
EXPOSE 8080 9464

HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["/app/.venv/bin/python", "-c", "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2).status != 200)"]

ENTRYPOINT ["/app/.venv/bin/reshape"]
# Listening on all interfaces needs an allow-list (never an open proxy): private networks here;
# narrow it to your clients with `docker run … reshape run … --allow-clients CIDR`.
CMD ["run", "--listen", "0.0.0.0:8080", "--admin", "0.0.0.0:9464", "--confdir", "/home/reshape/.reshape", \
     "--allow-clients", "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16"]
