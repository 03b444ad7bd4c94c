# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.upgrade contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """Kubernetes connection options, with kubernetes.core's names (AUTH_ARG_SPEC in _k8s.py)."""

    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path to a kubeconfig file (several joined by C(:) are merged as kubectl merges them; each must exist), or
        the kubeconfig as a dictionary.
      - Without it and without O(host), the files named by E(KUBECONFIG) are read and merged as kubectl merges them
        (the first file to name a cluster, user or context wins it; files that do not exist are skipped), else
        C(~/.kube/config), and without any of them the in-cluster service account is used.
      - A request answered 401 reads the credentials again from the same options and is sent once more (rotated
        exec, OIDC, token-file and service account tokens); a second 401 is the error.
      - A kubeconfig with a token, a token file, client certificates or basic auth is read by the collection; one
        whose user has an C(exec) or C(auth-provider) plugin, and the in-cluster service account, by the
        C(kubernetes) library's loaders.
      - Can also be set with E(K8S_AUTH_KUBECONFIG).
      - The option is secret (C(no_log)) because an inline kubeconfig carries tokens, passwords and keys; nothing
        of it reaches a result, a registered variable or the output, at any verbosity. Ansible masks every string
        of a secret option wherever it appears, so a message may show C(********) in place of the kubeconfig's
        path or of a short value the inline kubeconfig also holds (a context or cluster name).
    type: raw
  context:
    description:
      - The kubeconfig context to use. Can also be set with E(K8S_AUTH_CONTEXT).
    type: str
  host:
    description:
      - URL of the Kubernetes API server; overrides the kubeconfig's server. Can also be set with E(K8S_AUTH_HOST).
    type: str
  api_key:
    description:
      - Bearer token for the API server. Can also be set with E(K8S_AUTH_API_KEY).
    type: str
  username:
    description:
      - Username for basic authentication (with O(password)). Can also be set with E(K8S_AUTH_USERNAME).
    type: str
  password:
    description:
      - Password for basic authentication. Can also be set with E(K8S_AUTH_PASSWORD).
    type: str
  validate_certs:
    description:
      - Whether to verify the API server's TLS certificate. Without it the kubeconfig decides.
      - Only a YAML boolean turns verification off. A kubeconfig whose C(insecure-skip-tls-verify) is anything else (the
        string V("false"), V(no), V(0)) is refused, as C(kubectl) refuses it.
      - Can also be set with E(K8S_AUTH_VERIFY_SSL) (V(true) or V(false)).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description:
      - Path to a CA bundle that signs the API server's certificate. Can also be set with E(K8S_AUTH_SSL_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description:
      - Path to a client certificate. Can also be set with E(K8S_AUTH_CERT_FILE).
    type: path
    aliases: [cert_file]
  client_key:
    description:
      - Path to the client certificate's key. Can also be set with E(K8S_AUTH_KEY_FILE).
    type: path
    aliases: [key_file]
  proxy:
    description:
      - HTTP proxy URL for the API connection. Can also be set with E(K8S_AUTH_PROXY), or with the kubeconfig's
        C(proxy-url).
      - Without any of these, E(https_proxy) or E(http_proxy) (by the API's scheme), else E(all_proxy), apply, as for
        C(kubectl); E(no_proxy) (host names and their subdomains, C(host:port), IP networks, C(*)) bypasses any proxy.
      - A URL with credentials in it (C(http://user:secret@proxy:3128)) is refused, since a module's options are in the
        task result's invocation; give them as O(proxy_headers.proxy_basic_auth).
    type: str
  proxy_headers:
    description:
      - Headers for the proxy.
    type: dict
    suboptions:
      proxy_basic_auth:
        description:
          - The proxy's credentials, C(user:password), sent as C(Proxy-Authorization) (or given to a SOCKS proxy);
            never logged.
        type: str
  impersonate_user:
    description:
      - Username to impersonate (C(Impersonate-User) header).
    type: str
  impersonate_groups:
    description:
      - Groups to impersonate (C(Impersonate-Group) header).
    type: list
    elements: str
  request_timeout:
    description:
      - Seconds one API request may take before it counts as failed.
      - Reads that time out, or are answered 500, 502, 503 or 504, are retried a bounded number of
        times; writes are never re-sent blindly (a Node patch answered 409 is re-read and re-computed).
    type: float
    default: 30
requirements:
  - urllib3 (Python library) for every request, and PyYAML to read a kubeconfig file
  - kubernetes >= 31.0.0 (Python library), only for a kubeconfig whose user has an C(exec) or C(auth-provider) plugin,
    and for the in-cluster service account
notes:
  - All Kubernetes modules of the collection belong to the C(gpufleet.upgrade.k8s) action group, so
    C(module_defaults) with C(group/gpufleet.upgrade.k8s) sets these options once.
"""
