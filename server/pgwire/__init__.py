"""Strata's SQL port: the PostgreSQL protocol in front of Strata's PostgreSQL.

A client speaks to the port as to PostgreSQL. Each client connection gets a connection of
its own to PostgreSQL, and the startup, authentication and every statement that is not
Strata's are relayed unchanged; Strata's statements (CREATE/DROP STREAM, SHOW STREAMS,
EXPLAIN STREAM, COPY and INSERT into a raw stream) are answered by the port itself.

    messages.py    framing and the messages the port reads or writes
    statements.py  splitting a query string and recognising Strata's statements
    values.py      the VALUES of an INSERT, and Bind parameters, as field texts
    errors.py      Strata's errors as PostgreSQL ErrorResponses (SQLSTATE, position)
    commands.py    running a Strata statement against the service
    session.py     one client connection: the relay and the statements it answers
    server.py      the listener, on an event loop of its own thread
"""
