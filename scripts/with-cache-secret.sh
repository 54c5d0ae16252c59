#!/bin/sh
# Run a command with the remote compiler cache's credential in its environment.
#
# The credential is a BuildKit/buildah secret (RUN --mount=type=secret,id=cache_password): a file under
# /run/secrets that exists only while this one RUN step runs. It is read into the environment variable the
# recipe names (cache.credentials_env, passed as the build arg CACHE_CREDENTIALS_ENV: a variable *name*,
# never the value), so it never reaches a layer, an ENV, an ARG or the image history. Without a secret the
# command runs as is (local cache only).
set -eu

secret="${CACHE_SECRET_DIR:-/run/secrets}/${CACHE_SECRET_ID:-cache_password}"
if [ -s "$secret" ]; then
  name="${CACHE_CREDENTIALS_ENV:-}"
  case "$name" in
    "" )
      echo "with-cache-secret: a cache secret was given but the recipe sets no cache.credentials_env to hold it" >&2
      exit 2 ;;
    [0-9]* | *[!A-Za-z0-9_]* )
      echo "with-cache-secret: CACHE_CREDENTIALS_ENV=$name is not an environment variable name" >&2
      exit 2 ;;
  esac
  value=$(cat "$secret")
  export "$name=$value"
  unset value
fi
exec "$@"
