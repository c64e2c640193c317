"""DID method plug-ins for :class:`~a2a_secure.identity.resolver.DIDResolver`.

A method plug-in is an async callable ``resolver(did) -> ResolvedDID`` that raises
``DIDResolutionError`` (-32047) for a DID it cannot resolve. ``key`` and ``web`` are the
built-in ones; :mod:`a2a_secure.identity.methods.github` is an example of a third one,
registered with ``resolver.register("github", GithubResolver(...))`` or published by a
package under the entry point group ``a2a_secure.did_methods``::

    [project.entry-points."a2a_secure.did_methods"]
    github = "a2a_secure.identity.methods.github:GithubResolver"
"""
