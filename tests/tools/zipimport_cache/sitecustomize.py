"""A bytecode cache for the Python that Ansible compiles from source in every process: the tests' and the lab's.

Ansible runs every module as an AnsiballZ payload: a zip of the module and the module_utils it imports
(ansible.module_utils.basic and its dependencies, the collection's plugins/module_utils), imported with zipimport,
which compiles each file from source in every module process and never writes a .pyc. On the controller, Ansible's
collection loader compiles the collection's plugins (filters, action plugins) and the module_utils they import from
source too, in every forked worker that imports them (a worker is forked per task and host). A profile of an
8-node lab (issue 36, docs/development.md) put about a sixth of the lab's CPU in those compiles.

This file, first on the PYTHONPATH of the playbooks the tests and the lab run (tests/tools/zipimport_cache.py puts
it there, with GPUFLEET_ZIPIMPORT_CACHE naming the cache directory), keeps each compiled file under that directory,
keyed by the interpreter's magic number, the file's name (its path inside the zip) and the SHA-256 of its source: a
changed file is compiled again and nothing else changes. Real controllers and nodes run without it. Without
GPUFLEET_ZIPIMPORT_CACHE in the environment it does nothing.
"""
import hashlib
import importlib.util
import marshal
import os
import sys
import zipimport

_DIR = os.environ.get('GPUFLEET_ZIPIMPORT_CACHE')
_ZIP_COMPILE = getattr(zipimport, '_compile_source', None)
_LOADER = 'ansible.utils.collection_loader._collection_finder'


def _cached(name, source, compile_it):
    data = source if isinstance(source, bytes) else source.encode('utf-8', 'surrogateescape')
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER + name.encode('utf-8', 'surrogateescape') + b'\0' + data).hexdigest()
    path = os.path.join(_DIR, key[:2], key)
    try:
        with open(path, 'rb') as f:
            return marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = compile_it()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = '%s.%d.tmp' % (path, os.getpid())
        with open(tmp, 'wb') as f:
            marshal.dump(code, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return code


def _zip_compile_source(pathname, source):
    return _cached('zip:' + pathname.rsplit('.zip' + os.sep, 1)[-1], source, lambda: _ZIP_COMPILE(pathname, source))


def _loader_compile(source, filename, mode, flags=0, dont_inherit=False, *args, **kwargs):
    """compile() as the collection loader calls it (a whole file, mode exec); anything else is compiled as asked."""
    if mode != 'exec' or flags or args or kwargs or not isinstance(source, (str, bytes)):
        return compile(source, filename, mode, flags, dont_inherit, *args, **kwargs)
    return _cached('file:' + str(filename), source, lambda: compile(source, filename, mode, flags, dont_inherit))


class _PatchCollectionLoader:
    """A meta path finder that lets the collection loader's module load as usual, then points its compile() at the
    cache (the loader looks the name up in its module's globals)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != _LOADER:
            return None
        sys.meta_path.remove(_PatchCollectionLoader)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            module.compile = _loader_compile
        spec.loader.exec_module = exec_and_patch
        return spec


if _DIR:
    if _ZIP_COMPILE is not None:
        zipimport._compile_source = _zip_compile_source
    sys.meta_path.insert(0, _PatchCollectionLoader)
