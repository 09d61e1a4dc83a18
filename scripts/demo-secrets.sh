# Demo values for the secrets inventory/demo.yaml grants (source this file; never real secrets).
# Each agent gets its own value: one value granted to two agents is an audit finding.
export DEMO_CHAT_TOKEN_CONCIERGE=demo-chat-concierge-1f3a
export DEMO_CHAT_TOKEN_ENGINEER=demo-chat-engineer-7b21
export DEMO_CHAT_TOKEN_REVIEWER=demo-chat-reviewer-c04e
export DEMO_CHAT_TOKEN_QA=demo-chat-qa-92d5
export DEMO_DB_PASSWORD_CONCIERGE=demo-db-concierge-5e8c
export DEMO_FORGE_TOKEN_ENGINEER=demo-forge-engineer-a9b0
export DEMO_FORGE_TOKEN_REVIEWER=demo-forge-reviewer-3d71
