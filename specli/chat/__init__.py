"""`specli chat`: the session (:mod:`specli.chat.session`: conversation, template, context fitting, slash
commands, /save; no terminal needed) and its front end (:mod:`specli.chat.repl`: terminal or piped
input, drawing replies, Ctrl-C). The typer command that builds both lives in :mod:`specli.cli`.
"""
