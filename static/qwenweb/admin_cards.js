/**
 * admin_cards.js — every admin table labels its cells with their column's header
 * (`data-label`), so that admin.css can show each row as a card of "label value" lines on
 * a phone (no table scrolling sideways inside its box). Loaded by
 * templates/admin/base_site.html; nothing changes where the table fits.
 */
function labelCells(table) {
  const headers = [...table.querySelectorAll("thead tr:last-child > th")].map((th) => th.textContent.trim());
  for (const row of table.querySelectorAll("tbody > tr")) {
    [...row.children].forEach((cell, index) => {
      if (headers[index] && !cell.dataset.label) cell.dataset.label = headers[index];
    });
  }
}

for (const table of document.querySelectorAll("#result_list, .inline-group .tabular table")) labelCells(table);
