// Generated from the broker's list (src/domain/invisible.rs): do not edit.
// Its test `the_inbox_page_uses_the_brokers_list` fails when this file differs; write it
// again with `UPDATE_INBOX_LIST=1 cargo test --lib the_inbox_page_uses_the_brokers_list`.

/** One character the broker counts as hiding itself (astral ones too: the `u` flag). */
export const INVISIBLE = /[\u{AD}\u{34F}\u{600}-\u{605}\u{61C}\u{6DD}\u{70F}\u{890}-\u{891}\u{8E2}\u{115F}-\u{1160}\u{17B4}-\u{17B5}\u{180B}-\u{180F}\u{200B}-\u{200F}\u{2028}-\u{202E}\u{2060}-\u{206F}\u{3164}\u{FE00}-\u{FE0F}\u{FEFF}\u{FFA0}\u{FFF9}-\u{FFFB}\u{110BD}\u{110CD}\u{13430}-\u{1343F}\u{1BCA0}-\u{1BCA3}\u{1D173}-\u{1D17A}\u{E0000}-\u{E0FFF}]/u;
